//! What `/proc` and the cgroup say about a watched command: its process tree,
//! the tree's resident memory, and how many times the kernel's OOM killer
//! has killed a process of this job's cgroup.

use std::collections::HashMap;
use std::path::Path;

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub ppid: u32,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Parse one `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses: the fields after
/// it start after the last `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let rest: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state): ppid is field 4, rss field 24.
    Some(Stat { pid, ppid: rest.get(1)?.parse().ok()?, rss_pages: rest.get(21)?.parse().ok()? })
}

/// Every process `/proc` lists now (one that ends while it is read is left out).
pub fn all_processes() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|l| parse_stat(&l))
        .collect()
}

/// `root` and its descendants among `procs`, `root` first.
pub fn tree(procs: &[Stat], root: u32) -> Vec<Stat> {
    let mut children: HashMap<u32, Vec<&Stat>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out: Vec<Stat> = procs.iter().filter(|p| p.pid == root).copied().collect();
    let mut i = 0;
    while i < out.len() {
        let pid = out[i].pid;
        if let Some(kids) = children.get(&pid) {
            out.extend(kids.iter().map(|k| **k).filter(|k| k.pid != root));
        }
        i += 1;
    }
    out
}

/// The page size, for RSS in bytes.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|n| *n > 0).unwrap_or(4096)
}

/// The process tree under `root` now: its pids and its resident bytes,
/// summed over its processes (pages two of them share count twice).
pub fn tree_now(root: u32) -> (Vec<u32>, u64) {
    let t = tree(&all_processes(), root);
    let bytes = t.iter().map(|p| p.rss_pages).sum::<u64>() * page_size();
    (t.iter().map(|p| p.pid).collect(), bytes)
}

/// How many processes the OOM killer has killed in this process's cgroup
/// (`own`: `/proc/self/cgroup`; `root`: `/sys/fs/cgroup`): cgroup v2's
/// `oom_kill` in `memory.events`, or v1's in the memory controller's
/// `memory.oom_control`. `None` where neither can be read.
pub fn oom_kills(own: &str, root: &Path) -> Option<u64> {
    let mut found = None;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let rel = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            root.join(rel).join("memory.events")
        } else if controllers.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.oom_control")
        } else {
            continue;
        };
        if let Some(n) = std::fs::read_to_string(file).ok().as_deref().and_then(oom_kill_field) {
            found = Some(found.unwrap_or(0u64).max(n));
        }
    }
    found
}

/// The `oom_kill N` line of a `memory.events` or `memory.oom_control` file.
pub fn oom_kill_field(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

/// [`oom_kills`] of this process's cgroup.
pub fn own_oom_kills() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    oom_kills(&own, Path::new("/sys/fs/cgroup"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_parentheses_in_its_name_parses() {
        let line = "4242 (python (x) y) S 4200 4242 4200 0 -1 4194560 1 0 0 0 3 1 0 0 20 0 1 0 100 123456 789 18446744073709551615 1 1 0 0 0";
        assert_eq!(parse_stat(line), Some(Stat { pid: 4242, ppid: 4200, rss_pages: 789 }));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_tree_holds_the_root_and_every_descendant_only() {
        let s = |pid, ppid| Stat { pid, ppid, rss_pages: u64::from(pid) };
        let procs = [s(1, 0), s(10, 1), s(11, 10), s(12, 11), s(13, 10), s(20, 1), s(21, 20)];
        let pids: Vec<u32> = tree(&procs, 10).iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![10, 11, 13, 12]);
        assert!(tree(&procs, 99).is_empty());
    }

    #[test]
    fn this_process_tree_has_resident_memory() {
        let (pids, bytes) = tree_now(std::process::id());
        assert_eq!(pids.first(), Some(&std::process::id()));
        assert!(bytes > 1 << 20, "a test process holds more than 1 MiB resident: {bytes}");
    }

    #[test]
    fn oom_kills_are_read_from_v2_and_v1_cgroups() {
        let root = tempfile::tempdir().unwrap();
        let v2 = root.path().join("system.slice/job_7/step_batch");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.events"), "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
            .unwrap();
        assert_eq!(oom_kills("0::/system.slice/job_7/step_batch\n", root.path()), Some(2));
        let v1 = root.path().join("memory/slurm/uid_1/job_7");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n").unwrap();
        assert_eq!(oom_kills("5:cpuset:/x\n4:memory:/slurm/uid_1/job_7\n", root.path()), Some(1));
        assert_eq!(oom_kills("0::/nowhere\n", root.path()), None);
    }
}
