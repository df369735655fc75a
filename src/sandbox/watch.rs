//! Process trees from /proc: descendants of a process (daemonized ones
//! included, as long as they were re-parented to our subreaper launcher),
//! their memory and their number.

use std::collections::HashMap;

use crate::metrics::Limit;

/// (pid, ppid, rss pages) of every process.
fn processes() -> Vec<(u32, u32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut buf = [0u8; 1024];
    dir.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (ppid, pages) = stat_of(pid, &mut buf)?;
            Some((pid, ppid, pages))
        })
        .collect()
}

/// (ppid, rss pages) of one live process, from /proc/PID/stat; None for a
/// zombie. A process whose main thread exited while its other threads run
/// shows as a zombie with no memory, yet it lives: its threads hold memory
/// and fork children, so its memory is read from one of them.
fn stat_of(pid: u32, buf: &mut [u8]) -> Option<(u32, u64)> {
    let (state, ppid, rss) = parse_stat(&format!("/proc/{pid}/stat"), buf)?;
    if state != b'Z' {
        return Some((ppid, rss));
    }
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|t| t.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|tid| *tid != pid)
        .find_map(|tid| {
            let (state, _, rss) = parse_stat(&format!("/proc/{pid}/task/{tid}/stat"), buf)?;
            (state != b'Z').then_some((ppid, rss))
        })
}

/// (state, ppid, rss pages) from a stat file.
fn parse_stat(path: &str, buf: &mut [u8]) -> Option<(u8, u32, u64)> {
    // One read into a fixed buffer (a stat line is a few hundred bytes):
    // this runs for every watched process ten times a second.
    let stat = read_small(path, buf)?;
    // The command name is the process's to choose (spaces, parentheses,
    // bytes that are not UTF-8): parse only what follows the last ')'.
    let rest = stat
        .iter()
        .rposition(|&b| b == b')')
        .and_then(|i| std::str::from_utf8(&stat[i + 1..]).ok())?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] = state, [1] = ppid, ..., [21] = rss (pages)
    let state = fields.first()?.bytes().next()?;
    let ppid = fields.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let rss = fields.get(21).and_then(|s| s.parse().ok()).unwrap_or(0);
    Some((state, ppid, rss))
}

/// The children of every thread of `pid` (a child belongs to the thread that
/// forked it); None when the kernel has no `children` files
/// (CONFIG_PROC_CHILDREN) or the process is gone.
fn children_of(pid: u32, buf: &mut [u8]) -> Option<Vec<u32>> {
    let mut kids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Some(tid) = task
            .ok()
            .and_then(|t| t.file_name().to_str()?.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(list) = read_whole(&format!("/proc/{pid}/task/{tid}/children"), buf) else {
            // A thread that ended since the listing has no file; a kernel
            // without the files has none for any thread.
            if tid == pid {
                return None;
            }
            continue;
        };
        let list = std::str::from_utf8(&list).ok()?;
        kids.extend(
            list.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
    }
    Some(kids)
}

/// Most processes a walk of the watched trees visits: past it a tree is
/// over any process limit anyway.
const MAX_WALK: usize = 65_536;

/// A small /proc file, read with one read(2) into `buf`.
fn read_small<'a>(path: &str, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    use std::io::Read;
    let n = std::fs::File::open(path).ok()?.read(buf).ok()?;
    buf.get(..n)
}

/// A /proc file read to its end (at most 1 MiB: a thread's `children`
/// list takes 8 bytes or less per child), through `buf`.
fn read_whole(path: &str, buf: &mut [u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut out = Vec::new();
    loop {
        let n = file.read(buf).ok()?;
        if n == 0 {
            return Some(out);
        }
        if out.len() + n > 1 << 20 {
            // Past the bound: without the number the last read cut.
            let end = out.iter().rposition(|b| *b == b' ').unwrap_or(0);
            out.truncate(end);
            return Some(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// A process's proportional set size, from /proc/PID/smaps_rollup.
fn pss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096)
}

/// Every live descendant of `root` (not `root` itself).
pub fn descendants(root: u32) -> Vec<u32> {
    Snapshot::take()
        .tree(root)
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|p| *p != root)
        .collect()
}

/// The pid, as this process sees it, of the descendant of `root` that calls
/// itself `inner` in its own (possibly private) PID namespace.
pub fn host_pid(root: u32, inner: u32) -> Option<u32> {
    std::iter::once(root).chain(descendants(root)).find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last()?.parse::<u32>().ok())
            })
            == Some(inner)
    })
}

/// The process table at one moment.
pub struct Snapshot {
    children: HashMap<u32, Vec<(u32, u64)>>,
    rss: HashMap<u32, u64>,
    page: u64,
}

impl Snapshot {
    /// The whole process table (one read of /proc/PID/stat per process).
    pub fn take() -> Self {
        let mut children: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
        let mut rss = HashMap::new();
        for (pid, ppid, pages) in processes() {
            children.entry(ppid).or_default().push((pid, pages));
            rss.insert(pid, pages);
        }
        Self {
            children,
            rss,
            page: page_size(),
        }
    }

    /// The trees below `roots` only, walked down through each thread's
    /// `children` file: the cost follows the trees' size, not the number of
    /// processes on the machine. A child listed late (forked during the walk)
    /// is seen on the next look. Without the `children` files (or for a root
    /// that is gone), the whole table.
    pub fn of_trees(roots: &[u32]) -> Self {
        let mut buf = [0u8; 4096];
        let mut snap = Self {
            children: HashMap::new(),
            rss: HashMap::new(),
            page: page_size(),
        };
        let mut queue: Vec<(u32, Option<u32>)> = roots.iter().map(|r| (*r, None)).collect();
        let mut visited = 0usize;
        while let Some((pid, parent)) = queue.pop() {
            if snap.rss.contains_key(&pid) || visited >= MAX_WALK {
                continue;
            }
            visited += 1;
            let Some((_, pages)) = stat_of(pid, &mut buf) else {
                continue;
            };
            let Some(kids) = children_of(pid, &mut buf) else {
                return Self::take();
            };
            snap.rss.insert(pid, pages);
            if let Some(parent) = parent {
                snap.children.entry(parent).or_default().push((pid, pages));
            }
            queue.extend(kids.into_iter().map(|kid| (kid, Some(pid))));
        }
        snap
    }

    /// `root` (if alive) and its live descendants, with RSS in bytes.
    pub fn tree(&self, root: u32) -> Vec<(u32, u64)> {
        let Some(root_rss) = self.rss.get(&root) else {
            return Vec::new();
        };
        let mut out = vec![(root, root_rss * self.page)];
        let mut i = 0;
        while i < out.len() {
            let pid = out[i].0;
            if let Some(kids) = self.children.get(&pid) {
                for (kid, pages) in kids {
                    if *kid != root {
                        out.push((*kid, pages * self.page));
                    }
                }
            }
            i += 1;
        }
        out
    }

    /// Resident memory and number of processes of a tree.
    pub fn usage(&self, root: u32) -> (u64, usize) {
        let t = self.tree(root);
        (t.iter().map(|(_, rss)| rss).sum(), t.len())
    }

    /// Like `usage`, with memory as PSS (pages shared between processes of
    /// the tree, such as forked checkpoints, counted once in all): costs a
    /// read of each process's smaps_rollup.
    pub fn usage_pss(&self, root: u32) -> (u64, usize) {
        let t = self.tree(root);
        let pss = t
            .iter()
            .map(|(pid, rss)| pss_bytes(*pid).unwrap_or(*rss))
            .sum();
        (pss, t.len())
    }
}

/// SIGKILL to a whole tree, repeated until nothing is left (a fork bomb keeps
/// adding processes while it is being killed).
pub fn kill_tree(root: u32) {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::Pid;
    // Freeze the tree first: a stopped process cannot fork, and a stopped
    // parent cannot see its children die (a shell would otherwise report
    // "Killed" for its child and exit by itself, hiding that it was killed).
    let _ = killpg(Pid::from_raw(root as i32), Signal::SIGSTOP);
    let mut stopped = std::collections::HashSet::new();
    for _ in 0..100 {
        let fresh: Vec<u32> = Snapshot::take()
            .tree(root)
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !stopped.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
            stopped.insert(pid);
        }
    }
    // The root (a subreaper launcher under the sandbox) dies last, so orphans
    // are re-parented to it and found by the next pass instead of escaping.
    for _ in 0..100 {
        let below: Vec<u32> = Snapshot::take()
            .tree(root)
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p != root)
            .collect();
        if below.is_empty() {
            break;
        }
        for pid in below {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let _ = kill(Pid::from_raw(root as i32), Signal::SIGKILL);
    let _ = killpg(Pid::from_raw(root as i32), Signal::SIGKILL);
    // A process frozen above may have left the tree since (its parent died
    // with no subreaper to adopt it); stopped, it cannot have exited, so its
    // pid is still its own.
    for pid in stopped {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

/// Which limit a process tree of `count` processes using `rss` bytes went
/// over, and what it did, to follow its subject ("Session 'x' ",
/// "The job "): the same words for sessions and jobs.
pub fn limit_breach(
    rss: u64,
    count: usize,
    memory: Option<u64>,
    processes: u64,
) -> Option<(Limit, String)> {
    if count as u64 > processes {
        return Some((
            Limit::Processes,
            format!(
                "went over its limit of {processes} processes (--max-processes; a fork bomb?), so all of them were killed"
            ),
        ));
    }
    let limit = memory.filter(|&limit| rss > limit)?;
    Some((
        Limit::Memory,
        format!(
            "went over its memory limit of {} (--memory-limit): its processes used {} MiB, so they were killed",
            crate::units::human_bytes(limit),
            rss / (1024 * 1024)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::{Snapshot, limit_breach};

    #[test]
    fn a_tree_over_a_limit_is_named_with_its_flag() {
        assert!(limit_breach(10 << 20, 3, Some(100 << 20), 64).is_none());
        let (_, memory) = limit_breach(200 << 20, 3, Some(100 << 20), 64).unwrap();
        assert!(
            memory.contains("--memory-limit") && memory.contains("200 MiB"),
            "{memory}"
        );
        let (_, procs) = limit_breach(1, 65, None, 64).unwrap();
        assert!(procs.contains("--max-processes"), "{procs}");
        assert!(limit_breach(u64::MAX, 1, None, 64).is_none());
    }

    /// Kills `child` and its children (first, while they are still its).
    fn end(mut child: std::process::Child) {
        let _ = std::process::Command::new("pkill")
            .args(["-P", &child.id().to_string()])
            .status();
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_walk_of_the_tree_finds_what_the_whole_table_finds() {
        // sh with two sleeping children (and what they may fork).
        let child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let root = child.id();
        let pids = |snap: &Snapshot| {
            let mut t: Vec<u32> = snap.tree(root).iter().map(|(p, _)| *p).collect();
            t.sort();
            t
        };
        // Both sleeps are forked once sh reaches `wait`: look until they are.
        let mut walked = Vec::new();
        for _ in 0..500 {
            walked = pids(&Snapshot::of_trees(&[root]));
            if walked.len() == 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let whole = pids(&Snapshot::take());
        end(child);
        assert_eq!(walked.len(), 3, "{walked:?}");
        assert_eq!(walked, whole);
        assert!(Snapshot::of_trees(&[u32::MAX]).tree(u32::MAX).is_empty());
    }

    #[test]
    fn a_thread_with_hundreds_of_children_has_them_all_counted() {
        // More children than one 4 KiB read of a `children` file lists.
        let child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 700 ]; do sleep 30 & i=$((i+1)); done; wait",
            ])
            .spawn()
            .unwrap();
        let root = child.id();
        let mut seen = 0;
        for _ in 0..1000 {
            seen = Snapshot::of_trees(&[root]).tree(root).len();
            if seen == 701 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        end(child);
        assert_eq!(seen, 701);
    }

    #[test]
    fn a_process_whose_main_thread_exited_is_still_watched() {
        // Its threads keep 64 MiB and a child while /proc shows the process
        // itself as a zombie with no memory.
        let code = "import threading, ctypes, subprocess, time\n\
                    def work():\n\
                    \x20   global data\n\
                    \x20   data = bytearray(64 << 20)\n\
                    \x20   for i in range(0, len(data), 4096): data[i] = 1\n\
                    \x20   subprocess.Popen(['sleep', '30'])\n\
                    \x20   time.sleep(30)\n\
                    threading.Thread(target=work).start()\n\
                    ctypes.CDLL(None).pthread_exit(None)\n";
        let child = std::process::Command::new("python3")
            .args(["-c", code])
            .spawn()
            .unwrap();
        let root = child.id();
        let mut seen = (0, 0, 0);
        for _ in 0..1000 {
            let (walked, count) = Snapshot::of_trees(&[root]).usage(root);
            let (_, whole) = Snapshot::take().usage(root);
            seen = (walked, count, whole);
            if walked >= 64 << 20 && count == 2 && whole == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        end(child);
        assert!(seen.0 >= 64 << 20, "{seen:?}");
        assert_eq!((seen.1, seen.2), (2, 2), "{seen:?}");
    }
}
