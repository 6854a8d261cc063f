//! `fork::after_fork_in_child` (docs/reliability.md, "fork"). A binary of its
//! own: it resets every Stat of the process, which would disturb the unit
//! tests running beside it.
#![cfg(not(loom))]

use torchmon_core::aggregation::Aggregation::{Count, Sum};
use torchmon_core::fork;
use torchmon_core::stat::Stat;

#[test]
fn every_live_stat_is_emptied() {
    let stats: Vec<_> = (0..100)
        .map(|_| Stat::new(&[Sum, Count], 1000, i64::MAX))
        .collect();
    // Created and dropped: pruned from the list, not reset.
    for _ in 0..200 {
        Stat::new(&[Sum], 1000, i64::MAX).add_at(1.0, 0);
    }
    let idle = Stat::new(&[Sum], 1000, i64::MAX);
    for stat in &stats {
        stat.add_at(1.0, 0);
        stat.add_at(2.0, 0);
    }
    assert_eq!(torchmon_core::stat::live::count(), 101);

    assert_eq!(fork::after_fork_in_child(), 100);

    assert!(stats.iter().all(|s| s.count() == 0 && s.flush().is_none()));
    assert_eq!(idle.count(), 0);
    stats[0].add_at(5.0, 1);
    assert_eq!(stats[0].flush().map(|w| (w.count, w.sum)), Some((1, 5.0)));
}
