//! jemalloc's heap profiler, driven through `mallctl` (`tikv-jemalloc-ctl`) and read from the
//! text dump jemalloc writes (`heap_v2`, the format `jeprof` reads). Kiln reads the dump itself
//! rather than through `jemalloc_pprof`: that crate's `pprof_util` switches on prost's
//! `no-recursion-limit` feature, which Cargo would unify into every protobuf decoder of the
//! process (ADR 0012).

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Why the heap profile could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeapError {
    #[error("jemalloc refused {what}: {source}")]
    Mallctl {
        what: &'static str,
        source: tikv_jemalloc_ctl::Error,
    },
    #[error("cannot read the heap dump {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the heap dump is malformed at line {line}: {reason}")]
    Malformed { line: usize, reason: &'static str },
}

/// One allocating stack of a dump: return addresses, leaf first, and the bytes in use it
/// stands for (the sampled bytes scaled up as `jeprof` does).
#[derive(Debug, Clone, PartialEq)]
pub struct HeapStack {
    pub addrs: Vec<usize>,
    pub bytes: f64,
}

/// The process's heap profiler; one dump at a time.
pub struct HeapProfiler {
    /// Where jemalloc writes a dump, NUL-terminated, as `prof.dump` takes it.
    dump_path: &'static [u8],
    lock: Mutex<()>,
}

impl HeapProfiler {
    /// Turns sampling on. `Ok(None)` when jemalloc was built or configured without profiling
    /// (`prof:true` in `JEMALLOC_SYS_WITH_MALLOC_CONF`, `.cargo/config.toml`).
    pub fn start() -> Result<Option<Self>, HeapError> {
        let enabled =
            tikv_jemalloc_ctl::profiling::prof::read().map_err(|source| HeapError::Mallctl {
                what: "opt.prof",
                source,
            })?;
        if !enabled {
            return Ok(None);
        }
        activate()?;
        Ok(Some(Self {
            dump_path: dump_path(),
            lock: Mutex::new(()),
        }))
    }

    /// The live sampled allocations now, by stack.
    pub fn dump(&self) -> Result<Vec<HeapStack>, HeapError> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        tikv_jemalloc_ctl::raw::write_str(b"prof.dump\0", self.dump_path).map_err(|source| {
            HeapError::Mallctl {
                what: "prof.dump",
                source,
            }
        })?;
        let path = PathBuf::from(
            std::str::from_utf8(&self.dump_path[..self.dump_path.len() - 1]).unwrap_or_default(),
        );
        let text = std::fs::read_to_string(&path);
        let _ = std::fs::remove_file(&path);
        let text = text.map_err(|source| HeapError::Read { path, source })?;
        parse(&text)
    }
}

/// `prof.active = true`: starts sampling allocations.
#[allow(unsafe_code)]
fn activate() -> Result<(), HeapError> {
    // SAFETY: `prof.active` is a documented writable `bool` control
    // (https://jemalloc.net/jemalloc.3.html#prof.active) and `true` is a `bool`; the crate
    // offers no safe setter for it.
    unsafe { tikv_jemalloc_ctl::raw::write(b"prof.active\0", true) }.map_err(|source| {
        HeapError::Mallctl {
            what: "prof.active",
            source,
        }
    })
}

/// The dump file of this process (in the temporary directory), made once: `prof.dump` takes a
/// pointer that must stay valid, so the path lives as long as the process.
fn dump_path() -> &'static [u8] {
    static PATH: OnceLock<&'static [u8]> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("kiln-heap-{}.heap", std::process::id()));
        let mut bytes = path.to_string_lossy().into_owned().into_bytes();
        bytes.retain(|&b| b != 0);
        bytes.push(0);
        Box::leak(bytes.into_boxed_slice())
    })
}

/// Reads a `heap_v2` dump:
///
/// ```text
/// heap_v2/524288                       sampling period in bytes
///   t*: 28106: 56637512 [0: 0]         totals (skipped)
///   [... per-thread lines ...]
/// @ 0x1 0x2 0x3                        a stack, leaf first
///   t*: 13: 6688 [0: 0]                its sampled objects and bytes (all threads)
///   t0: 13: 6688 [0: 0]
/// MAPPED_LIBRARIES:
/// ...
/// ```
///
/// A stack's bytes are unbiased as `jeprof` (and `jemalloc_pprof`) do: with `r` the mean
/// object size over the sampling period, `bytes / (1 - e^-r)`.
pub fn parse(text: &str) -> Result<Vec<HeapStack>, HeapError> {
    let mut lines = text.lines().enumerate();
    let malformed = |line: usize, reason| HeapError::Malformed {
        line: line + 1,
        reason,
    };
    let (_, first) = lines.next().ok_or(malformed(0, "the dump is empty"))?;
    let period: f64 = first
        .trim()
        .strip_prefix("heap_v2/")
        .and_then(|p| p.parse().ok())
        .filter(|p: &f64| *p > 0.0)
        .ok_or(malformed(
            0,
            "the first line is not heap_v2/<sampling period>",
        ))?;
    let mut stacks = Vec::new();
    let mut current: Option<Vec<usize>> = None;
    for (n, line) in lines {
        let line = line.trim();
        if line.starts_with("MAPPED_LIBRARIES") {
            break;
        }
        if let Some(addrs) = line.strip_prefix('@') {
            if current.is_some() {
                return Err(malformed(n, "a stack without its counts"));
            }
            let addrs = addrs
                .split_ascii_whitespace()
                .map(|a| usize::from_str_radix(a.trim_start_matches("0x"), 16))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| malformed(n, "an address is not hexadecimal"))?;
            current = Some(addrs);
            continue;
        }
        let Some(counts) = line.strip_prefix("t*:") else {
            continue;
        };
        let Some(addrs) = current.take() else {
            // The totals line before the first stack.
            continue;
        };
        let mut words = counts.split_ascii_whitespace();
        let objects: f64 = words
            .next()
            .and_then(|w| w.trim_end_matches(':').parse().ok())
            .ok_or(malformed(n, "the object count is not a number"))?;
        let bytes: f64 = words
            .next()
            .and_then(|w| w.parse().ok())
            .ok_or(malformed(n, "the byte count is not a number"))?;
        if objects <= 0.0 || bytes <= 0.0 {
            continue;
        }
        let ratio = (bytes / objects) / period;
        stacks.push(HeapStack {
            addrs,
            bytes: bytes / (1.0 - (-ratio).exp()),
        });
    }
    if current.is_some() {
        return Err(malformed(
            text.lines().count(),
            "a stack without its counts",
        ));
    }
    Ok(stacks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "heap_v2/524288
  t*: 3: 1572864 [0: 0]
  t0: 3: 1572864 [0: 0]
@ 0x10 0x20 0x30
  t*: 2: 1048576 [0: 0]
  t0: 2: 1048576 [0: 0]
@ 0x11 0x30
  t*: 1: 64 [0: 0]

MAPPED_LIBRARIES:
55d0c0000000-55d0c1000000 r-xp 00000000 08:01 1 /usr/bin/kiln
";

    #[test]
    fn reads_stacks_leaf_first_with_unbiased_bytes() {
        let stacks = parse(DUMP).unwrap();
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0].addrs, vec![0x10, 0x20, 0x30]);
        // Objects of exactly the period: scaled by 1 / (1 - 1/e).
        let want = 1_048_576.0 / (1.0 - (-1.0f64).exp());
        assert!((stacks[0].bytes - want).abs() < 1e-6);
        // A small object is sampled rarely: it stands for many.
        assert_eq!(stacks[1].addrs, vec![0x11, 0x30]);
        assert!(stacks[1].bytes > 500_000.0, "{}", stacks[1].bytes);
    }

    #[test]
    fn refuses_what_is_not_a_dump() {
        assert!(parse("").is_err());
        assert!(parse("heap_v1/10\n").is_err());
        assert!(parse("heap_v2/524288\n@ 0x1 zz\n  t*: 1: 2 [0: 0]\n").is_err());
        assert!(parse("heap_v2/524288\n@ 0x1\n").is_err());
    }
}
