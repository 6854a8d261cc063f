//! The aggregations a Stat can report, with torch.monitor's C++ enum values.

/// One aggregation. The discriminants are the C++ `torch::monitor::Aggregation`
/// values (torch's Python binding maps VALUE to 0 by mistake; we do not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Aggregation {
    Value = 1,
    Mean = 2,
    Count = 3,
    Sum = 4,
    Max = 5,
    Min = 6,
}

impl Aggregation {
    pub const ALL: [Aggregation; 6] = [
        Aggregation::Value,
        Aggregation::Mean,
        Aggregation::Count,
        Aggregation::Sum,
        Aggregation::Max,
        Aggregation::Min,
    ];

    pub fn from_value(value: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|a| *a as i64 == value)
    }

    /// Member name, as Python shows it (`Aggregation.SUM`).
    pub fn name(self) -> &'static str {
        match self {
            Aggregation::Value => "VALUE",
            Aggregation::Mean => "MEAN",
            Aggregation::Count => "COUNT",
            Aggregation::Sum => "SUM",
            Aggregation::Max => "MAX",
            Aggregation::Min => "MIN",
        }
    }

    /// The suffix used in Stat event keys (`loss.sum`).
    pub fn key_suffix(self) -> &'static str {
        match self {
            Aggregation::Value => "value",
            Aggregation::Mean => "mean",
            Aggregation::Count => "count",
            Aggregation::Sum => "sum",
            Aggregation::Max => "max",
            Aggregation::Min => "min",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_cpp_enum() {
        let values: Vec<i64> = Aggregation::ALL.iter().map(|a| *a as i64).collect();
        assert_eq!(values, [1, 2, 3, 4, 5, 6]);
        assert_eq!(Aggregation::from_value(4), Some(Aggregation::Sum));
        assert_eq!(Aggregation::from_value(0), None);
        assert_eq!(Aggregation::from_value(7), None);
    }
}
