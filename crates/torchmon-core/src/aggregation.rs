//! The aggregations a Stat can report, defined once in [`TABLE`].
//!
//! Everything else follows from the table: the Python enum's members, values
//! and messages (py_aggregation.rs), the module-level aliases and the names
//! the CLI and the TensorBoard sink recognise in event keys (python/torchmon),
//! and which accumulators a window keeps ([`Needs::of`]). Adding an
//! aggregation is a row here, its read-out in `WindowStats::get` (stat.rs,
//! which the compiler points to), and its line in the Python stubs
//! (tests/api/test_aggregation.py checks that they agree).

/// The accumulators of a window that an aggregation reads (the sample count
/// is always kept); a window skips those no configured aggregation reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    pub sum: bool,
    pub min: bool,
    pub max: bool,
    pub last: bool,
    /// The sums shifted by the window's first sample (STDDEV).
    pub spread: bool,
    /// The window's histogram (the P aggregations).
    pub histogram: bool,
}

impl Needs {
    pub const COUNT_ONLY: Needs = Needs {
        sum: false,
        min: false,
        max: false,
        last: false,
        spread: false,
        histogram: false,
    };
    pub const SUM: Needs = Needs {
        sum: true,
        ..Needs::COUNT_ONLY
    };
    pub const MIN: Needs = Needs {
        min: true,
        ..Needs::COUNT_ONLY
    };
    pub const MAX: Needs = Needs {
        max: true,
        ..Needs::COUNT_ONLY
    };
    pub const LAST: Needs = Needs {
        last: true,
        ..Needs::COUNT_ONLY
    };
    pub const SPREAD: Needs = Needs {
        spread: true,
        ..Needs::COUNT_ONLY
    };
    /// A quantile reads the histogram, and min and max (exact at the ends,
    /// and the clamp); the window's Distribution also carries the sum.
    pub const HISTOGRAM: Needs = Needs {
        histogram: true,
        sum: true,
        min: true,
        max: true,
        ..Needs::COUNT_ONLY
    };

    /// What a Stat reporting `aggregations` must accumulate.
    pub fn of(aggregations: &[Aggregation]) -> Needs {
        aggregations
            .iter()
            .fold(Needs::COUNT_ONLY, |all, a| all.union(a.row().needs))
    }

    fn union(self, other: Needs) -> Needs {
        Needs {
            sum: self.sum || other.sum,
            min: self.min || other.min,
            max: self.max || other.max,
            last: self.last || other.last,
            spread: self.spread || other.spread,
            histogram: self.histogram || other.histogram,
        }
    }
}

/// One row of [`TABLE`].
#[derive(Debug)]
pub struct Row {
    pub aggregation: Aggregation,
    /// Member name, as Python shows it (`Aggregation.SUM`, `torchmon.SUM`).
    pub name: &'static str,
    /// The suffix of this aggregation's key in a Stat event (`loss.sum`).
    pub key_suffix: &'static str,
    pub needs: Needs,
}

/// Declares the enum and the table from one list, so neither can miss a row.
macro_rules! aggregation_table {
    ($($variant:ident = $value:literal, $name:literal, $suffix:literal, $needs:expr;)+) => {
        /// One aggregation. The discriminants of the first six are the C++
        /// `torch::monitor::Aggregation` values (torch's Python binding maps
        /// VALUE to 0 by mistake; we do not); 7 and up are torchmon's
        /// extensions (docs/compatibility.md).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Aggregation {
            $($variant = $value,)+
        }

        /// Every aggregation, in value order.
        pub const TABLE: &[Row] = &[
            $(Row {
                aggregation: Aggregation::$variant,
                name: $name,
                key_suffix: $suffix,
                needs: $needs,
            },)+
        ];
    };
}

aggregation_table! {
    // variant = C++ value, Python name, event-key suffix, accumulators read
    Value = 1, "VALUE", "value", Needs::LAST;
    Mean = 2, "MEAN", "mean", Needs::SUM;
    Count = 3, "COUNT", "count", Needs::COUNT_ONLY;
    Sum = 4, "SUM", "sum", Needs::SUM;
    Max = 5, "MAX", "max", Needs::MAX;
    Min = 6, "MIN", "min", Needs::MIN;
    Stddev = 7, "STDDEV", "stddev", Needs::SPREAD;
    P50 = 8, "P50", "p50", Needs::HISTOGRAM;
    P90 = 9, "P90", "p90", Needs::HISTOGRAM;
    P95 = 10, "P95", "p95", Needs::HISTOGRAM;
    P99 = 11, "P99", "p99", Needs::HISTOGRAM;
    P999 = 12, "P999", "p999", Needs::HISTOGRAM;
}

// `Aggregation::row` indexes the table by value, and the Python enum's error
// message gives the valid values as a range: both need the values to run
// without a gap, in table order.
const _: () = {
    let mut i = 0;
    while i < TABLE.len() {
        assert!(TABLE[i].aggregation as usize == TABLE[0].aggregation as usize + i);
        i += 1;
    }
};

impl Aggregation {
    /// The smallest and the largest valid value.
    pub const VALUE_RANGE: (i64, i64) = (
        TABLE[0].aggregation as i64,
        TABLE[TABLE.len() - 1].aggregation as i64,
    );

    pub fn from_value(value: i64) -> Option<Self> {
        let index = value.checked_sub(Self::VALUE_RANGE.0)?;
        let row = TABLE.get(usize::try_from(index).ok()?)?;
        Some(row.aggregation)
    }

    pub fn row(self) -> &'static Row {
        &TABLE[self as usize - TABLE[0].aggregation as usize]
    }

    /// Member name, as Python shows it (`Aggregation.SUM`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The suffix used in Stat event keys (`loss.sum`).
    pub fn key_suffix(self) -> &'static str {
        self.row().key_suffix
    }

    /// The member's repr, as a Python enum's: `<Aggregation.SUM: 4>`.
    pub fn repr(self) -> String {
        format!("<Aggregation.{}: {}>", self.name(), self as i64)
    }

    /// The `ValueError` message of a value that is no member's; `repr` is
    /// the value's Python repr.
    pub fn invalid_value_message(repr: &str) -> String {
        let (first, last) = Self::VALUE_RANGE;
        format!("{repr} is not a valid Aggregation (valid values: {first} to {last})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_cpp_enum() {
        let values: Vec<i64> = TABLE.iter().map(|r| r.aggregation as i64).collect();
        assert_eq!(values, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(Aggregation::VALUE_RANGE, (1, 12));
        assert_eq!(Aggregation::Sum.repr(), "<Aggregation.SUM: 4>");
        assert_eq!(
            Aggregation::invalid_value_message("13"),
            "13 is not a valid Aggregation (valid values: 1 to 12)"
        );
        assert_eq!(Aggregation::from_value(4), Some(Aggregation::Sum));
        assert_eq!(Aggregation::from_value(0), None);
        assert_eq!(Aggregation::from_value(7), Some(Aggregation::Stddev));
        assert_eq!(Aggregation::from_value(12), Some(Aggregation::P999));
        assert_eq!(Aggregation::from_value(13), None);
        assert_eq!(Aggregation::from_value(i64::MIN), None);
        assert_eq!(Aggregation::from_value(i64::MAX), None);
    }

    #[test]
    fn every_row_is_found_by_its_value_and_names_are_distinct() {
        for row in TABLE {
            let found = Aggregation::from_value(row.aggregation as i64).unwrap();
            assert_eq!(found, row.aggregation);
            assert_eq!(found.row().name, row.name);
            assert_eq!(TABLE.iter().filter(|r| r.name == row.name).count(), 1);
            let suffixes = TABLE.iter().filter(|r| r.key_suffix == row.key_suffix);
            assert_eq!(suffixes.count(), 1);
        }
        assert_eq!(Aggregation::Sum.name(), "SUM");
        assert_eq!(Aggregation::Value.key_suffix(), "value");
    }

    #[test]
    fn needs_are_the_union_of_what_each_aggregation_reads() {
        assert_eq!(Needs::of(&[]), Needs::COUNT_ONLY);
        assert_eq!(Needs::of(&[Aggregation::Count]), Needs::COUNT_ONLY);
        assert_eq!(Needs::of(&[Aggregation::Mean]), Needs::SUM);
        let all: Vec<Aggregation> = TABLE.iter().map(|r| r.aggregation).collect();
        let every = Needs {
            sum: true,
            min: true,
            max: true,
            last: true,
            spread: true,
            histogram: true,
        };
        let torch: Vec<Aggregation> = all[..6].to_vec();
        assert_eq!(
            Needs::of(&torch),
            Needs {
                spread: false,
                histogram: false,
                ..every
            },
            "the torch aggregations keep no extension state"
        );
        assert_eq!(Needs::of(&[Aggregation::Stddev]), Needs::SPREAD);
        assert_eq!(
            Needs::of(&[Aggregation::P99]),
            Needs {
                histogram: true,
                sum: true,
                min: true,
                max: true,
                ..Needs::COUNT_ONLY
            }
        );
        assert_eq!(Needs::of(&all), every);
        assert_eq!(
            Needs::of(&[Aggregation::Value, Aggregation::Max]),
            Needs {
                last: true,
                max: true,
                ..Needs::COUNT_ONLY
            }
        );
    }
}
