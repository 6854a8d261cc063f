//! One aggregation of one Stat across the windows of a log, in constant
//! memory: `torchmon summarize`'s last, mean, min, max and trend columns
//! (docs/cli.md). Every float operation is the one the Python code before it
//! made, in the same order, so that the table is byte for byte the same.

/// The most points a trend is drawn with: a sparkline of at most this many
/// characters, each the mean of a run of consecutive windows.
pub const TREND_WIDTH: usize = 24;

/// A series of any length kept as at most [`TREND_WIDTH`] runs of
/// consecutive values (the sum and count of their finite ones): when the
/// runs are full, neighbours are merged in pairs and each run from then on
/// holds twice as many values, so memory stays the same however many
/// windows a log holds.
#[derive(Clone, Debug, Default)]
pub struct Trend {
    sums: Vec<f64>,
    counts: Vec<u64>,
    /// Values per run; only the last run may be partly filled.
    run: u64,
    /// Values the runs so far hold.
    capacity: u64,
}

impl Trend {
    fn open_run(&mut self) {
        if self.sums.len() == TREND_WIDTH {
            self.sums = self.sums.chunks(2).map(|p| p[0] + p[1]).collect();
            self.counts = self.counts.chunks(2).map(|p| p[0] + p[1]).collect();
            self.run *= 2;
        }
        self.run = self.run.max(1);
        self.sums.push(0.0);
        self.counts.push(0);
        self.capacity = self.sums.len() as u64 * self.run;
    }

    /// The sparkline: one of `bars` (low to high) per run, a space for a run
    /// of only NaN windows; empty when no window was finite.
    pub fn draw(&self, bars: &[char]) -> String {
        let means: Vec<f64> = self
            .sums
            .iter()
            .zip(&self.counts)
            .map(|(&total, &n)| if n > 0 { total / n as f64 } else { f64::NAN })
            .collect();
        let finite = means.iter().copied().filter(|m| m.is_finite());
        let (low, high) = finite.fold((f64::NAN, f64::NAN), |(lo, hi), m| {
            (
                if lo.is_nan() || m < lo { m } else { lo },
                if hi.is_nan() || m > hi { m } else { hi },
            )
        });
        if low.is_nan() || bars.is_empty() {
            return String::new();
        }
        let top = bars.len() - 1;
        let mut line: String = means
            .iter()
            .map(|&mean| {
                if !mean.is_finite() {
                    ' '
                } else if high == low {
                    bars[top / 2]
                } else {
                    // high - low may overflow to inf for values near the float limits.
                    let fraction = if (high - low).is_finite() {
                        (mean - low) / (high - low)
                    } else {
                        (mean / 2.0 - low / 2.0) / (high / 2.0 - low / 2.0)
                    };
                    bars[top.min((fraction * bars.len() as f64) as usize)]
                }
            })
            .collect();
        line.truncate(line.trim_end().len());
        line
    }
}

/// One aggregation's values across windows: the last one, the exact mean,
/// min and max of the non-NaN ones, and the trend.
#[derive(Clone, Debug)]
pub struct Series {
    seen: u64,
    /// Non-NaN values.
    pub n: u64,
    pub last: f64,
    pub low: f64,
    pub high: f64,
    pos_inf: bool,
    neg_inf: bool,
    /// The finite values' exact sum as non-overlapping partials (Shewchuk's,
    /// as `math.fsum` keeps them), scaled down by `2**-scale` once a value is
    /// so large that sums could overflow.
    partials: Vec<f64>,
    scale: i32,
    pub trend: Trend,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            seen: 0,
            n: 0,
            last: f64::NAN,
            low: f64::INFINITY,
            high: f64::NEG_INFINITY,
            pos_inf: false,
            neg_inf: false,
            partials: Vec::new(),
            scale: 0,
            trend: Trend::default(),
        }
    }
}

/// `2**e` as a double, for |e| within the normal exponents.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

impl Series {
    pub fn add(&mut self, value: f64) {
        self.seen += 1;
        self.last = value;
        if self.seen > self.trend.capacity {
            self.trend.open_run();
        }
        if value.is_finite() {
            *self.trend.sums.last_mut().expect("a run is open") += value;
            *self.trend.counts.last_mut().expect("a run is open") += 1;
            self.n += 1;
            if value < self.low {
                self.low = value;
            }
            if value > self.high {
                self.high = value;
            }
            self.add_finite(value);
        } else if !value.is_nan() {
            self.n += 1;
            if value > 0.0 {
                self.pos_inf = true;
                self.high = value;
            } else {
                self.neg_inf = true;
                self.low = value;
            }
        }
    }

    fn add_finite(&mut self, mut x: f64) {
        if self.scale == 0 && x.abs() > pow2(1000) {
            // From here on the sum is kept as a multiple of 2**64: no sum of
            // fewer than 2**23 doubles overflows, and values this large make
            // the bits lost below 2**-958 irrelevant to the mean.
            self.scale = 64;
            for p in &mut self.partials {
                *p *= pow2(-64);
            }
        }
        if self.scale != 0 {
            x *= pow2(-self.scale);
        }
        let mut i = 0;
        for j in 0..self.partials.len() {
            let mut y = self.partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                self.partials[i] = lo;
                i += 1;
            }
            x = hi;
        }
        self.partials.truncate(i);
        self.partials.push(x);
    }

    /// The mean of the non-NaN values, as IEEE arithmetic has it where
    /// `math.fsum` raises: inf and -inf give NaN, and a sum beyond the float
    /// range (two values near 1e308) is no reason for the mean to be.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            return f64::NAN;
        }
        if self.pos_inf {
            return if self.neg_inf {
                f64::NAN
            } else {
                f64::INFINITY
            };
        }
        if self.neg_inf {
            return f64::NEG_INFINITY;
        }
        let n = self.n as f64;
        let unscale = |v: f64| {
            if self.scale != 0 {
                v * pow2(self.scale)
            } else {
                v
            }
        };
        match fsum(self.partials.iter().copied()) {
            Some(total) => unscale(total / n),
            None => unscale(fsum(self.partials.iter().map(|p| p / n)).unwrap_or(f64::NAN)),
        }
    }
}

/// CPython's `math.fsum`, the correctly rounded sum: `None` where it raises
/// `OverflowError` (a finite sum beyond the float range); an inf or NaN item
/// gives the IEEE sum of those items.
pub fn fsum(items: impl Iterator<Item = f64>) -> Option<f64> {
    let mut p: Vec<f64> = Vec::new();
    let (mut special_sum, mut inf_sum) = (0.0f64, 0.0f64);
    for item in items {
        let mut x = item;
        let xsave = x;
        let mut i = 0;
        for j in 0..p.len() {
            let mut y = p[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                p[i] = lo;
                i += 1;
            }
            x = hi;
        }
        p.truncate(i);
        if x != 0.0 {
            if !x.is_finite() {
                if xsave.is_finite() {
                    return None;
                }
                if xsave.is_infinite() {
                    inf_sum += xsave;
                }
                special_sum += xsave;
                p.clear();
            } else {
                p.push(x);
            }
        }
    }
    if special_sum != 0.0 {
        // CPython raises ValueError for inf + -inf; the NaN says the same.
        return Some(if inf_sum.is_nan() {
            f64::NAN
        } else {
            special_sum
        });
    }
    let mut hi = 0.0;
    let mut n = p.len();
    if n > 0 {
        n -= 1;
        hi = p[n];
        let mut lo = 0.0;
        while n > 0 {
            let x = hi;
            n -= 1;
            let y = p[n];
            hi = x + y;
            let yr = hi - x;
            lo = y - yr;
            if lo != 0.0 {
                break;
            }
        }
        // Half-even rounding across several partials, as CPython does it.
        if n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            let yr = x - hi;
            if y == yr {
                hi = x;
            }
        }
    }
    Some(hi)
}
