//! Wire formats shared by the sinks that write their own bytes: `protobuf`,
//! the one protobuf writer of the Prometheus exposition
//! (prometheus/protobuf.rs) and the TensorBoard event file
//! (tensorboard/proto.rs), which keep only their messages' field tables and
//! how each message is laid out (docs/internals.md, the module map).

pub mod protobuf;
