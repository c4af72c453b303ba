//! What an ELF file is, read from its headers and notes without loading it whole: the ids a
//! profile may name it by (GNU build id, Go build id, the OpenTelemetry file id), what it can
//! name functions with (DWARF, symbol tables, Go's `.gopclntab`) and whether it holds code.

use std::io::{Read, Seek, SeekFrom};

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, ReadRef, SectionKind};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// What a debug file can be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// It holds the program's code (and may hold symbols and DWARF besides).
    Executable,
    /// Debug information without the code (`objcopy --only-keep-debug`, a `-dbgsym` file).
    DebugOnly,
    /// Neither code nor DWARF: symbol tables (or Go's line table) only.
    SymbolsOnly,
}

impl FileKind {
    /// The name the debug-info API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executable => "executable",
            Self::DebugOnly => "debug-only",
            Self::SymbolsOnly => "symbols-only",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Executable, Self::DebugOnly, Self::SymbolsOnly]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// An ELF file's identity and contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    /// The GNU build id note, lowercase hex.
    pub gnu_build_id: Option<String>,
    /// Go's build id note, as `go tool buildid` prints it.
    pub go_build_id: Option<String>,
    /// The OpenTelemetry profiler's file id (`process.executable.build_id.htlhash`) of these
    /// very bytes: 32 lowercase hex digits.
    pub file_id: String,
    pub kind: FileKind,
    pub has_dwarf: bool,
    pub has_symtab: bool,
    pub has_dynsym: bool,
    pub has_gopclntab: bool,
    /// `ET_EXEC`, `ET_DYN`, … (`e_type`).
    pub elf_type: u16,
    pub size: u64,
}

impl ElfInfo {
    /// Every id a profile may name this file by: the GNU id, the Go id as is and hex-encoded
    /// (as the Parca agent writes it), and the file id.
    pub fn ids(&self) -> Vec<String> {
        let mut ids = Vec::new();
        if let Some(g) = &self.gnu_build_id {
            ids.push(g.clone());
        }
        if let Some(g) = &self.go_build_id {
            ids.push(g.clone());
            ids.push(hex(g.as_bytes()));
        }
        ids.push(self.file_id.clone());
        ids.dedup();
        ids
    }

    /// Whether anything in it can name a function.
    pub fn has_symbols(&self) -> bool {
        self.has_dwarf || self.has_symtab || self.has_dynsym || self.has_gopclntab
    }
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The OpenTelemetry profiler's file id of a file of `size` bytes whose first and last 4 KiB
/// are `head` and `tail`: SHA-256 of both and the size (8 bytes, big-endian), the first 16
/// bytes of the digest in hex.
pub fn file_id(head: &[u8], tail: &[u8], size: u64) -> String {
    let mut h = Sha256::new();
    h.update(head);
    h.update(tail);
    h.update(size.to_be_bytes());
    hex(&h.finalize()[..16])
}

/// Bytes at each end of a file that its file id hashes.
const FILE_ID_SPAN: u64 = 4096;

/// The file id of an open file (reads 8 KiB at most).
pub fn file_id_of(file: &mut std::fs::File) -> Result<String> {
    let size = file.seek(SeekFrom::End(0)).map_err(Error::Io)?;
    let mut head = vec![0u8; size.min(FILE_ID_SPAN) as usize];
    file.seek(SeekFrom::Start(0)).map_err(Error::Io)?;
    file.read_exact(&mut head).map_err(Error::Io)?;
    let mut tail = vec![0u8; size.min(FILE_ID_SPAN) as usize];
    file.seek(SeekFrom::Start(size - tail.len() as u64))
        .map_err(Error::Io)?;
    file.read_exact(&mut tail).map_err(Error::Io)?;
    Ok(file_id(&head, &tail, size))
}

/// Identifies a file on disk, reading only its headers, notes and the parts its file id hashes.
pub fn identify_file(path: &std::path::Path) -> Result<ElfInfo> {
    let mut file = std::fs::File::open(path).map_err(Error::Io)?;
    let id = file_id_of(&mut file)?;
    let size = file.seek(SeekFrom::End(0)).map_err(Error::Io)?;
    let cache = object::ReadCache::new(file);
    identify_with(&cache, id, size)
}

/// Identifies a file held in memory.
pub fn identify(data: &[u8]) -> Result<ElfInfo> {
    let span = (data.len() as u64).min(FILE_ID_SPAN) as usize;
    let id = file_id(&data[..span], &data[data.len() - span..], data.len() as u64);
    identify_with(data, id, data.len() as u64)
}

fn identify_with<'d, R: ReadRef<'d>>(data: R, file_id: String, size: u64) -> Result<ElfInfo> {
    let elf_magic = data.read_bytes_at(0, 4).is_ok_and(|m| m == b"\x7fELF");
    let file = object::File::parse(data).map_err(|e| {
        if elf_magic {
            Error::Damaged(format!("{e} (a truncated or damaged file)"))
        } else {
            Error::NotElf(e.to_string())
        }
    })?;
    let elf_type = match &file {
        object::File::Elf32(f) => f.elf_header().e_type.get(f.endian()).0,
        object::File::Elf64(f) => f.elf_header().e_type.get(f.endian()).0,
        _ => return Err(Error::NotElf(format!("a {:?} file", file.format()))),
    };
    let gnu_build_id = file
        .build_id()
        .map_err(|e| Error::Damaged(format!("the GNU build id note: {e}")))?
        .filter(|id| !id.is_empty())
        .map(hex);
    let go_build_id = go_build_id(&file)?;
    let section = |name: &str| file.section_by_name(name);
    let has_dwarf = section(".debug_info").is_some_and(|s| s.size() > 0);
    // Symbols that name code: defined functions (imports name nothing).
    let names_code = |t: Option<object::SymbolTable<'d, '_, R>>| {
        t.is_some_and(|t| {
            t.symbols()
                .any(|s| s.kind() == object::SymbolKind::Text && !s.is_undefined())
        })
    };
    let has_symtab = names_code(file.symbol_table());
    let has_dynsym = names_code(file.dynamic_symbol_table());
    let has_gopclntab = section(".gopclntab")
        .or_else(|| section(".data.rel.ro.gopclntab"))
        .is_some_and(|s| s.kind() != SectionKind::UninitializedData && s.size() > 0);
    // Code: a `.text` with contents (a debug-only file keeps the section header, without bytes).
    let has_code = section(".text").is_some_and(|s| {
        s.kind() == SectionKind::Text && s.file_range().is_some_and(|(_, len)| len > 0)
    });
    let kind = if has_code {
        FileKind::Executable
    } else if has_dwarf {
        FileKind::DebugOnly
    } else {
        FileKind::SymbolsOnly
    };
    // Every section's data must lie inside the file: a truncated file is refused here rather
    // than found wanting at query time.
    for s in file.sections() {
        if let Some((offset, len)) = s.file_range()
            && offset.checked_add(len).is_none_or(|end| end > size)
        {
            return Err(Error::Damaged(format!(
                "section {} runs past the end of the file",
                s.name().unwrap_or("?")
            )));
        }
    }
    Ok(ElfInfo {
        gnu_build_id,
        go_build_id,
        file_id,
        kind,
        has_dwarf,
        has_symtab,
        has_dynsym,
        has_gopclntab,
        elf_type,
        size,
    })
}

/// Go's build id note (`.note.go.buildid`: name "Go", type 4, the id as text).
fn go_build_id<'d, R: ReadRef<'d>>(file: &object::File<'d, R>) -> Result<Option<String>> {
    let Some(section) = file.section_by_name(".note.go.buildid") else {
        return Ok(None);
    };
    let data = section
        .data()
        .map_err(|e| Error::Damaged(format!("the Go build id note: {e}")))?;
    let little = file.is_little_endian();
    let word = |at: usize| -> Option<u32> {
        let b: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let bad = || Error::Damaged("the Go build id note is malformed".into());
    let (namesz, descsz, kind) = (word(0).ok_or_else(bad)?, word(4).ok_or_else(bad)?, word(8));
    let name_end = 12 + namesz as usize;
    let desc_start = name_end.div_ceil(4) * 4;
    let name = data.get(12..name_end).ok_or_else(bad)?;
    let desc = data
        .get(desc_start..desc_start + descsz as usize)
        .ok_or_else(bad)?;
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    if &name[..name_len] != b"Go" || kind != Some(4) {
        return Ok(None);
    }
    let id = String::from_utf8_lossy(desc).into_owned();
    Ok((!id.is_empty()).then_some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_ids_hash_both_ends_and_the_size() {
        // The profiler's own definition: sha256(head ‖ tail ‖ be64(size))[..16].
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let id = file_id(&data[..4096], &data[10_000 - 4096..], 10_000);
        assert_eq!(id.len(), 32);
        let mut h = Sha256::new();
        h.update(&data[..4096]);
        h.update(&data[10_000 - 4096..]);
        h.update(10_000u64.to_be_bytes());
        assert_eq!(id, hex(&h.finalize()[..16]));
        // A small file is hashed twice over (head and tail overlap).
        let small = b"\x7fELF tiny";
        let id = file_id(small, small, small.len() as u64);
        assert_eq!(id.len(), 32);
    }

    #[test]
    fn non_elf_is_refused() {
        assert!(matches!(
            identify(b"not an elf file"),
            Err(Error::NotElf(_))
        ));
        // ELF's magic, and nothing after it: a truncated file.
        assert!(matches!(identify(b"\x7fELF"), Err(Error::Damaged(_))));
    }
}
