//! Go's line table (`.gopclntab`), which every Go binary keeps even when built without DWARF
//! (`-ldflags=-w`) or stripped: function entries, names, and per-pc file and line tables. Every
//! layout since Go 1.2 is read: Go 1.2 (to 1.15), 1.16, 1.18 and 1.20 onward (Go's `debug/gosym`
//! and `runtime/symtab.go` define them); Go 1.0 and 1.1 tables are refused.
//!
//! A pc inside inlined code gets the function it was inlined into, with the file and line of the
//! inlined code, as `go tool addr2line` reports it.

use crate::{Error, Result};

/// The table layouts Kiln reads, by the magic number that opens the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// Go 1.2 to 1.15: one table, offsets from its start, files by index.
    Go12,
    Go116,
    Go118,
    Go120,
}

/// A parsed line table (the section's bytes, owned).
#[derive(Debug)]
pub struct GoLineTable {
    data: Vec<u8>,
    little: bool,
    version: Version,
    ptr: usize,
    quantum: u64,
    nfunc: usize,
    text_start: u64,
    funcnametab: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    functab: usize,
}

/// What the table says of a pc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: u32,
}

/// Longest name read from the table (a longer one is cut there).
const MAX_NAME: usize = 4096;

impl GoLineTable {
    /// Parses a `.gopclntab` section. `text_start` is where the code starts when the table does
    /// not say (Go 1.16; or a table whose text start was left to a relocation): the
    /// `runtime.text` symbol, else the `.text` section's address.
    pub fn parse(data: Vec<u8>, little: bool, text_start: u64) -> Result<Self> {
        let bad = |why: &str| Error::Damaged(format!("Go line table: {why}"));
        if data.len() < 16 {
            return Err(bad("shorter than its header"));
        }
        let magic = read_u32(&data, 0, little).ok_or_else(|| bad("no header"))?;
        let version = match magic {
            0xffff_fffb => Version::Go12,
            0xffff_fffa => Version::Go116,
            0xffff_fff0 => Version::Go118,
            0xffff_fff1 => Version::Go120,
            other => return Err(bad(&format!("unknown magic {other:#x}"))),
        };
        let (quantum, ptr) = (u64::from(data[6]), usize::from(data[7]));
        if !matches!(ptr, 4 | 8) || !matches!(quantum, 1 | 2 | 4) {
            return Err(bad("bad pointer size or instruction quantum"));
        }
        let word = |i: usize| -> Result<usize> {
            read_uint(&data, 8 + i * ptr, ptr, little)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| bad("header past the end"))
        };
        let nfunc = word(0)?;
        let (text, funcnametab, cutab, filetab, pctab, functab) = if version == Version::Go12 {
            // The function table follows nfunc: an entry and an offset per function, the end
            // pc, then the file table's offset. Names and pc tables are at offsets from 0.
            let functab = 8 + ptr;
            let fileoff = nfunc
                .checked_mul(2)
                .and_then(|n| n.checked_add(1))
                .and_then(|n| n.checked_mul(ptr))
                .and_then(|n| n.checked_add(functab))
                .and_then(|at| read_u32(&data, at, little))
                .ok_or_else(|| bad("the function table runs past the end"))?;
            (0, 0, 0, fileoff as usize, 0, functab)
        } else {
            // Go 1.18 added the text start after nfunc and nfiles; the offsets follow.
            let (header_text, first) = match version {
                Version::Go118 | Version::Go120 => (word(2)? as u64, 3),
                Version::Go12 | Version::Go116 => (0, 2),
            };
            (
                header_text,
                word(first)?,
                word(first + 1)?,
                word(first + 2)?,
                word(first + 3)?,
                word(first + 4)?,
            )
        };
        let table = Self {
            little,
            version,
            ptr,
            quantum,
            nfunc,
            text_start: if text != 0 { text } else { text_start },
            funcnametab,
            cutab,
            filetab,
            pctab,
            functab,
            data,
        };
        for off in [
            table.funcnametab,
            table.cutab,
            table.filetab,
            table.pctab,
            table.functab,
        ] {
            if off > table.data.len() {
                return Err(bad("an offset past the end of the table"));
            }
        }
        let entry_size = table.functab_entry_size();
        if nfunc
            .checked_add(1)
            .and_then(|n| n.checked_mul(entry_size))
            .and_then(|n| n.checked_add(table.functab))
            .is_none_or(|end| end > table.data.len())
        {
            return Err(bad("the function table runs past the end"));
        }
        Ok(table)
    }

    /// The bytes the table holds (for a cache's weight).
    pub fn size(&self) -> usize {
        self.data.len()
    }

    fn functab_entry_size(&self) -> usize {
        match self.version {
            Version::Go12 | Version::Go116 => 2 * self.ptr,
            Version::Go118 | Version::Go120 => 8,
        }
    }

    /// Function `i`'s entry pc and its `_func` offset in the table.
    fn functab_entry(&self, i: usize) -> Option<(u64, usize)> {
        let at = self.functab + i * self.functab_entry_size();
        match self.version {
            // Go 1.2's offsets are from the table's start, Go 1.16's from the function table's.
            Version::Go12 | Version::Go116 => {
                let entry = read_uint(&self.data, at, self.ptr, self.little)?;
                let off = read_uint(&self.data, at + self.ptr, self.ptr, self.little)?;
                let from = if self.version == Version::Go12 {
                    0
                } else {
                    self.functab
                };
                Some((entry, from.checked_add(usize::try_from(off).ok()?)?))
            }
            Version::Go118 | Version::Go120 => {
                let entry = u64::from(read_u32(&self.data, at, self.little)?);
                let off = read_u32(&self.data, at + 4, self.little)? as usize;
                Some((
                    self.text_start.checked_add(entry)?,
                    self.functab.checked_add(off)?,
                ))
            }
        }
    }

    /// The function containing `pc`, with the file and line of `pc`.
    pub fn lookup(&self, pc: u64) -> Option<GoFrame> {
        if self.nfunc == 0 {
            return None;
        }
        let (first, _) = self.functab_entry(0)?;
        let (end, _) = self.functab_entry(self.nfunc)?;
        if pc < first || pc >= end {
            return None;
        }
        // The last function whose entry is at or below pc.
        let (mut lo, mut hi) = (0usize, self.nfunc);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.functab_entry(mid)?.0 <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (entry, func) = self.functab_entry(lo)?;
        // `_func` field offsets: Go 1.16 starts with a pointer-sized entry, later ones with a
        // 32-bit entry offset.
        let base = match self.version {
            Version::Go12 | Version::Go116 => func + self.ptr,
            Version::Go118 | Version::Go120 => func + 4,
        };
        let field = |i: usize| read_u32(&self.data, base + 4 * i, self.little);
        let (name_off, pcfile, pcln) = (field(0)?, field(4)?, field(5)?);
        // Go 1.2's `_func` has no compilation unit (files are numbered for the whole table).
        let cu = match self.version {
            Version::Go12 => 0,
            Version::Go116 | Version::Go118 | Version::Go120 => field(7)?,
        };
        let function = self.cstr(self.funcnametab.checked_add(name_off as usize)?)?;
        let line = self.pc_value(pcln, entry, pc)?;
        let file = self.pc_value(pcfile, entry, pc).and_then(|fileno| {
            let fileno = u32::try_from(fileno).ok()?;
            // Go 1.2: the file table's entries (after its count) by number; later, the
            // compilation unit's entries in `cutab`, into the file names.
            let (index, strings) = if self.version == Version::Go12 {
                let files = read_u32(&self.data, self.filetab, self.little)?;
                if fileno == 0 || fileno >= files {
                    return None;
                }
                (self.filetab.checked_add(fileno as usize * 4)?, 0)
            } else {
                let at = (cu as usize).checked_add(fileno as usize)?;
                (self.cutab.checked_add(at.checked_mul(4)?)?, self.filetab)
            };
            let off = read_u32(&self.data, index, self.little)?;
            (off != u32::MAX)
                .then(|| self.cstr(strings.checked_add(off as usize)?))
                .flatten()
        });
        Some(GoFrame {
            function,
            file,
            line: u32::try_from(line).unwrap_or(0),
        })
    }

    /// The value of the pc-value table at `offset` (in the pc tables) for `target`, in the
    /// function starting at `entry`.
    fn pc_value(&self, offset: u32, entry: u64, target: u64) -> Option<i64> {
        if offset == 0 {
            return None;
        }
        let mut at = self.pctab.checked_add(offset as usize)?;
        let (mut value, mut pc) = (-1i64, entry);
        let mut first = true;
        // Each step reads at least two bytes, so the table's end bounds the loop.
        while at < self.data.len() {
            let (uvdelta, n) = read_varint(&self.data, at)?;
            at += n;
            if uvdelta == 0 && !first {
                return None;
            }
            first = false;
            let vdelta = if uvdelta & 1 != 0 {
                !(uvdelta >> 1) as i64
            } else {
                (uvdelta >> 1) as i64
            };
            let (pcdelta, n) = read_varint(&self.data, at)?;
            at += n;
            pc = pc.checked_add(pcdelta.checked_mul(self.quantum)?)?;
            value = value.wrapping_add(vdelta as i32 as i64);
            if target < pc {
                return Some(value);
            }
        }
        None
    }

    /// The NUL-terminated string at `at`.
    fn cstr(&self, at: usize) -> Option<String> {
        let rest = self.data.get(at..)?;
        let end = rest
            .iter()
            .take(MAX_NAME)
            .position(|&b| b == 0)
            .unwrap_or(rest.len().min(MAX_NAME));
        Some(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
}

fn read_u32(data: &[u8], at: usize, little: bool) -> Option<u32> {
    let b: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if little {
        u32::from_le_bytes(b)
    } else {
        u32::from_be_bytes(b)
    })
}

fn read_uint(data: &[u8], at: usize, size: usize, little: bool) -> Option<u64> {
    match size {
        4 => read_u32(data, at, little).map(u64::from),
        8 => {
            let b: [u8; 8] = data.get(at..at.checked_add(8)?)?.try_into().ok()?;
            Some(if little {
                u64::from_le_bytes(b)
            } else {
                u64::from_be_bytes(b)
            })
        }
        _ => None,
    }
}

/// An unsigned LEB128 varint of at most 10 bytes: its value and length.
fn read_varint(data: &[u8], at: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &b) in data.get(at..)?.iter().take(10).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_tables_are_refused_not_a_panic() {
        assert!(GoLineTable::parse(vec![], true, 0).is_err());
        assert!(GoLineTable::parse(vec![0xfb, 0xff, 0xff, 0xff, 0, 0, 1, 8], true, 0).is_err());
        let mut header = vec![0xf1, 0xff, 0xff, 0xff, 0, 0, 1, 8];
        header.extend([0xff; 64]);
        assert!(GoLineTable::parse(header, true, 0).is_err());
    }

    #[test]
    fn varints() {
        assert_eq!(read_varint(&[0x05], 0), Some((5, 1)));
        assert_eq!(read_varint(&[0x80, 0x01], 0), Some((128, 2)));
        assert_eq!(read_varint(&[0x80; 11], 0), None);
    }
}
