//! A torch job's process groups as the matrix shows them: from each Python rank's newest
//! flight-recorder snapshot, every group's members, its recent sequence numbers, and each
//! member's state in each, so "the group of ranks 4–7 is stuck because rank 5 never entered"
//! is one glance (`p` on the Run screen cycles the matrix through the groups).
use crate::torchfr::{Group, Snapshot};
use crate::ui::panels::matrix::Cell;
use std::collections::{BTreeMap, BTreeSet};

/// One process group, ready to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupView {
    /// PyTorch's name ("0" for the default group).
    pub name: String,
    pub desc: String,
    /// Global ranks of its members, ascending.
    pub ranks: Vec<u32>,
    /// Its recent sequence numbers, ascending.
    pub seqs: Vec<u64>,
    /// Per member (as `ranks`), per sequence number (as `seqs`).
    pub cells: Vec<Vec<Cell>>,
}

impl GroupView {
    /// `group 1 "tp" · ranks 4–7` (the description left out when PyTorch gave none).
    pub fn label(&self) -> String {
        let desc = match self.desc.as_str() {
            "" | "undefined" => String::new(),
            d => format!(" {d:?}"),
        };
        format!("group {}{desc} · ranks {}", self.name, ranks_text(&self.ranks))
    }
}

/// `4–7` for a run of consecutive ranks, else `0,2,4`.
fn ranks_text(ranks: &[u32]) -> String {
    match (ranks.first(), ranks.last()) {
        (Some(a), Some(b)) if ranks.len() > 2 && (b - a) as usize + 1 == ranks.len() => format!("{a}–{b}"),
        _ => ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}

/// Every group some rank's snapshot knows, by name (the default group first).
pub fn groups(flights: &BTreeMap<u32, Snapshot>) -> Vec<GroupView> {
    let mut names: BTreeMap<String, (String, BTreeSet<u32>)> = BTreeMap::new();
    for (&rank, snap) in flights {
        for g in &snap.dump.groups {
            let (desc, members) = names.entry(g.name.clone()).or_insert_with(|| (g.desc.clone(), BTreeSet::new()));
            if desc.is_empty() || desc == "undefined" {
                desc.clone_from(&g.desc);
            }
            // gloo's dumps in 2.11 do not list members: then the ranks that know the group.
            members.extend(if g.ranks.is_empty() { vec![rank] } else { g.ranks.clone() });
        }
    }
    let mut out: Vec<GroupView> =
        names.into_iter().map(|(name, (desc, members))| view(flights, name, desc, members)).collect();
    // Names are numbers as text ("0", "1", "10"): order them as numbers.
    out.sort_by_key(|g| (g.name.parse::<u64>().unwrap_or(u64::MAX), g.name.clone()));
    out
}

fn view(flights: &BTreeMap<u32, Snapshot>, name: String, desc: String, members: BTreeSet<u32>) -> GroupView {
    let mine = |rank: u32| -> Option<(&Group, &Snapshot)> {
        let snap = flights.get(&rank)?;
        Some((snap.dump.groups.iter().find(|g| g.name == name)?, snap))
    };
    let mut seqs = BTreeSet::new();
    for &rank in &members {
        if let Some((g, snap)) = mine(rank) {
            seqs.extend(snap.dump.entries.iter().filter(|e| e.group == name && !e.is_p2p).map(|e| e.seq));
            // A member's last enqueued collective may be older than the entries kept.
            if g.last_enqueued > 0 {
                seqs.insert(g.last_enqueued);
            }
        }
    }
    let seqs: Vec<u64> = seqs.into_iter().collect();
    let cells = members.iter().map(|&rank| seqs.iter().map(|&seq| cell(mine(rank), &name, seq)).collect()).collect();
    GroupView { name, desc, ranks: members.into_iter().collect(), seqs, cells }
}

/// One member's state in collective `seq` of group `name`.
fn cell(mine: Option<(&Group, &Snapshot)>, name: &str, seq: u64) -> Cell {
    let Some((g, snap)) = mine else { return Cell::Unknown };
    match snap.dump.entries.iter().find(|e| e.group == name && e.seq == seq) {
        Some(e) if e.finished() => Cell::Done,
        Some(_) => Cell::InFlight,
        None if seq <= g.last_completed => Cell::Done,
        None if seq <= g.last_enqueued => Cell::InFlight,
        None => Cell::NotEntered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torchfr::{Dump, Entry, EntryState};

    fn snap(groups: &[(&str, &str, u64, u64)], entries: &[(&str, u64, EntryState)]) -> Snapshot {
        Snapshot {
            dump: Dump {
                version: "2.10".into(),
                groups: groups
                    .iter()
                    .map(|&(name, desc, last_enqueued, last_completed)| Group {
                        name: name.into(),
                        desc: desc.into(),
                        ranks: Vec::new(),
                        last_enqueued,
                        last_completed,
                    })
                    .collect(),
                entries: entries
                    .iter()
                    .map(|&(group, seq, state)| Entry { group: group.into(), seq, state, ..Entry::default() })
                    .collect(),
            },
            main_stack: Vec::new(),
        }
    }

    #[test]
    fn a_subgroup_member_that_never_entered_stands_out_and_the_default_group_is_first() {
        use EntryState::*;
        let mut flights = BTreeMap::new();
        // Ranks 0–3 share the default group; ranks 2 and 3 also a "tp" subgroup "1", where
        // rank 2 entered seq 7 and rank 3 never did (it is still at 6).
        flights.insert(0, snap(&[("0", "default_pg", 10, 10)], &[("0", 10, Completed)]));
        flights.insert(1, snap(&[("0", "default_pg", 10, 10)], &[("0", 10, Completed)]));
        flights.insert(
            2,
            snap(&[("0", "default_pg", 10, 10), ("1", "tp", 7, 6)], &[("1", 6, Completed), ("1", 7, Started)]),
        );
        flights.insert(3, snap(&[("0", "default_pg", 10, 10), ("1", "tp", 6, 6)], &[("1", 6, Completed)]));
        let gs = groups(&flights);
        assert_eq!(gs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["0", "1"]);
        let tp = &gs[1];
        assert_eq!(tp.ranks, [2, 3]);
        assert_eq!(tp.seqs, [6, 7]);
        assert_eq!(tp.cells, [vec![Cell::Done, Cell::InFlight], vec![Cell::Done, Cell::NotEntered]]);
        assert_eq!(tp.label(), "group 1 \"tp\" · ranks 2,3");
        assert_eq!(gs[0].ranks, [0, 1, 2, 3]);
        assert_eq!(gs[0].label(), "group 0 \"default_pg\" · ranks 0–3");
        // Rank 2 and 3 kept no entry of the default group's seq 10: their counters say done.
        assert!(gs[0].cells.iter().all(|row| row == &[Cell::Done]), "{:?}", gs[0].cells);
    }
}
