//! Exposes PyO3's interpreter cfgs (`Py_GIL_DISABLED` among them) to this
//! crate: on GIL builds the binding relies on the GIL to serialise `Stat.add`.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
