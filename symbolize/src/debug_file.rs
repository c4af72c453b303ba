//! One debug file opened for lookups: DWARF through `addr2line` (functions, files, lines and
//! inlined frames; compressed sections, split DWARF), Go's `.gopclntab` where there is no DWARF,
//! and the symbol tables last. The file is memory-mapped by `addr2line`'s loader, so a 1 GiB
//! file costs the pages a lookup touches, not its size in heap.
//!
//! Compressed sections (`SHF_COMPRESSED`, zlib or zstd; GNU's `.zdebug_*`) are the exception:
//! the loader inflates each into the heap, to the size its own header declares. A client writes
//! that header, so [`Inflation`] reads every declared size first and [`DebugFile::open`] refuses
//! a file past its [`OpenLimits`] before anything is allocated.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use crate::gopclntab::GoLineTable;
use crate::{Error, Result};

/// One frame of a resolved address: a function, and where in it when known.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: String,
    pub file: Option<String>,
    /// 0 when unknown.
    pub line: u32,
}

/// A loadable segment: file offset (`None` where a debug-only file dropped the segment's
/// bytes and zeroed it), virtual address and size in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    offset: Option<u64>,
    vaddr: u64,
    memsz: u64,
    executable: bool,
}

/// A debug file open for lookups. `addr2line`'s loader parses lazily and caches what it parsed
/// inside itself, so lookups in one file take turns; lookups in different files do not.
pub struct DebugFile {
    loader: std::sync::Mutex<addr2line::Loader>,
    go: Option<GoLineTable>,
    segments: Vec<Segment>,
    elf_type: u16,
    has_dwarf: bool,
    dwarf_broken: std::sync::atomic::AtomicBool,
    /// Addresses of a few of its functions, to check that its DWARF reads.
    probes: Vec<u64>,
    /// The file's size: what its mapping may take of the page cache.
    size: u64,
    /// Bytes this file costs a cache: the Go table it holds (the mapping is the kernel's).
    heap_bytes: usize,
}

impl std::fmt::Debug for DebugFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugFile")
            .field("elf_type", &self.elf_type)
            .field("has_dwarf", &self.has_dwarf)
            .field("go", &self.go.is_some())
            .finish()
    }
}

/// A file's compressed sections may inflate to at most this many times the whole file's size.
/// DWARF compresses 3–10× with zlib or zstd; a stream of zeros, a thousand times and more.
pub const MAX_INFLATION_RATIO: u64 = 32;

/// What opening one debug file may inflate into the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenLimits {
    /// Bytes all of a file's compressed sections may inflate to: its tenant's
    /// `max_debuginfo_inflated_bytes` at upload, the symbolizer's bound at query time.
    pub max_inflated_bytes: u64,
}

impl OpenLimits {
    /// The bytes a file of `file_bytes` may inflate to: the smaller of the bound and
    /// [`MAX_INFLATION_RATIO`] times its size.
    pub fn limit_for(&self, file_bytes: u64) -> u64 {
        self.max_inflated_bytes
            .min(file_bytes.saturating_mul(MAX_INFLATION_RATIO))
    }
}

/// A file's compressed sections as their headers declare them; nothing is inflated to learn it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inflation {
    /// Bytes all of them declare once inflated.
    pub bytes: u64,
    /// The largest one's name and declared size.
    pub largest: Option<(String, u64)>,
    /// The file's own size.
    pub file_bytes: u64,
}

impl Inflation {
    /// Reads the section headers of the file at `path`.
    pub fn of_file(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(Error::Io)?;
        let size = file.metadata().map_err(Error::Io)?.len();
        let cache = object::ReadCache::new(file);
        let obj = object::File::parse(&cache).map_err(|e| Error::NotElf(e.to_string()))?;
        Ok(Self::of(&obj, size))
    }

    /// The compressed sections of a parsed file of `file_bytes`. Every compressed section
    /// counts, whatever its name: an upper bound of what the loader and the Go table inflate.
    pub fn of<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>, file_bytes: u64) -> Self {
        let mut out = Self {
            file_bytes,
            ..Self::default()
        };
        for section in obj.sections() {
            // A header that does not read is no inflation: `uncompressed_data` fails on it too.
            let Ok(range) = section.compressed_file_range() else {
                continue;
            };
            if range.format == object::CompressionFormat::None {
                continue;
            }
            let declared = range.uncompressed_size;
            out.bytes = out.bytes.saturating_add(declared);
            if out.largest.as_ref().is_none_or(|(_, n)| declared > *n) {
                let name = section.name().unwrap_or("?").to_owned();
                out.largest = Some((name, declared));
            }
        }
        out
    }

    /// Refuses a file whose sections would inflate past what `limits` allow it.
    pub fn check(&self, limits: OpenLimits) -> Result<()> {
        let limit = limits.limit_for(self.file_bytes);
        if self.bytes <= limit {
            return Ok(());
        }
        let (section, section_bytes) = self.largest.clone().unwrap_or_default();
        Err(Error::Inflates {
            declared: self.bytes,
            section,
            section_bytes,
            limit,
            file_bytes: self.file_bytes,
            ratio: MAX_INFLATION_RATIO,
            max: limits.max_inflated_bytes,
        })
    }
}

/// `ET_EXEC`, `ET_DYN` and `ET_REL` (`e_type`).
const ET_REL: u16 = 1;

/// Where a profile says a frame was: the mapping it fell in (process addresses, or the file's
/// own as the OpenTelemetry eBPF profiler reports them) and the address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MappingRange {
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
}

impl DebugFile {
    /// Opens a file for lookups (memory-mapped). A file whose compressed sections declare more
    /// than `limits` allow is refused ([`Error::Inflates`]) before anything is inflated.
    pub fn open(path: &Path, limits: OpenLimits) -> Result<Self> {
        // The headers and Go's table are read through a lazy view of the file, the DWARF
        // through the loader's mapping.
        let file = std::fs::File::open(path).map_err(Error::Io)?;
        let size = file.metadata().map_err(Error::Io)?.len();
        let cache = object::ReadCache::new(file);
        let obj = object::File::parse(&cache).map_err(|e| Error::NotElf(e.to_string()))?;
        let inflation = Inflation::of(&obj, size);
        inflation.check(limits)?;
        let loader = std::panic::catch_unwind(|| addr2line::Loader::new(path))
            .map_err(|_| Error::Damaged("its sections cannot be read".into()))?
            .map_err(|e| Error::Damaged(e.to_string()))?;
        let elf_type = match &obj {
            object::File::Elf32(f) => f.elf_header().e_type.get(f.endian()).0,
            object::File::Elf64(f) => f.elf_header().e_type.get(f.endian()).0,
            _ => return Err(Error::NotElf(format!("a {:?} file", obj.format()))),
        };
        let segments = load_segments(&obj);
        let has_dwarf = obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0);
        let go = go_table(&obj)?;
        let probes = probe_addresses(&obj);
        // The loader's inflated sections and its symbol map (a name and an address a symbol,
        // about the size of an ELF symbol), and Go's table.
        let symbols: u64 = [".symtab", ".dynsym"]
            .into_iter()
            .filter_map(|name| obj.section_by_name(name))
            .map(|s| s.size().min(size))
            .sum();
        let heap_bytes = usize::try_from(inflation.bytes.saturating_add(symbols))
            .unwrap_or(usize::MAX)
            .saturating_add(go.as_ref().map_or(0, GoLineTable::size));
        Ok(Self {
            loader: std::sync::Mutex::new(loader),
            go,
            segments,
            elf_type,
            has_dwarf,
            dwarf_broken: std::sync::atomic::AtomicBool::new(false),
            probes,
            size,
            heap_bytes,
        })
    }

    /// Addresses of up to 32 of the file's functions, spread over its symbol table.
    pub fn probe_addresses(&self) -> &[u64] {
        &self.probes
    }

    /// The file's size (its mapping's).
    pub fn mapped_bytes(&self) -> u64 {
        self.size
    }

    /// What this file costs in memory besides its mapping: inflated sections, its symbol map,
    /// Go's table.
    pub fn heap_bytes(&self) -> usize {
        self.heap_bytes
    }

    /// The address in the file's own address space of `address` in `mapping`, as pprof reads
    /// a mapping (google/pprof's `GetBase`): `start - offset + p_offset - p_vaddr` of the
    /// loadable segment the mapping's file offset falls in. Addresses the OpenTelemetry eBPF
    /// profiler reports are already the file's own, and this leaves them as they are.
    pub fn file_address(&self, mapping: MappingRange, address: u64) -> u64 {
        // No mapping, or one that spans everything (a kernel, a profile without mappings).
        let whole = mapping.start == 0
            && mapping.offset == 0
            && (mapping.limit == 0 || mapping.limit == u64::MAX);
        if whole || self.segments.is_empty() || mapping.limit <= mapping.start {
            return address;
        }
        if self.elf_type == ET_REL {
            return address.wrapping_sub(mapping.start);
        }
        let file_offset = address
            .wrapping_sub(mapping.start)
            .wrapping_add(mapping.offset);
        let page = |v: u64| v & !0xfff;
        // The segment the mapping maps, as pprof picks it; else the one the address's file
        // offset lies in, executable ones first.
        let known = self.segment_of_mapping(mapping, file_offset).or_else(|| {
            self.segments
                .iter()
                .filter(|s| s.executable)
                .chain(self.segments.iter().filter(|s| !s.executable))
                .find_map(|s| {
                    let offset = s.offset?;
                    (page(offset) <= file_offset && file_offset < offset.saturating_add(s.memsz))
                        .then_some((offset, s.vaddr))
                })
        });
        if let Some((offset, vaddr)) = known {
            let base = mapping
                .start
                .wrapping_sub(mapping.offset)
                .wrapping_add(offset)
                .wrapping_sub(vaddr);
            return address.wrapping_sub(base);
        }
        // A debug-only file does not know where its segments lay in the program's file. A
        // mapping from offset 0 maps the file from its start, which the first loadable segment
        // holds (with the ELF header): that segment's page is at `start` (one mapping for the
        // whole file, as pprof converters and non-PIE layouts have it). Any other mapping maps
        // the code's segment from that segment's page (a loadable segment's offset and address
        // agree below the page), so its first page is at `start`.
        let code = self
            .segments
            .iter()
            .find(|s| s.executable && s.offset.is_none());
        match (code, self.segments.first()) {
            (Some(_), Some(first)) if mapping.offset == 0 => {
                address.wrapping_sub(mapping.start.wrapping_sub(page(first.vaddr)))
            }
            (Some(s), _) => address.wrapping_sub(mapping.start.wrapping_sub(page(s.vaddr))),
            (None, _) => address,
        }
    }

    /// The file offset and address of the loadable segment `mapping` maps, as google/pprof's
    /// `FindProgHeaderForMapping` picks it (Parca's too): the segments overlapping the mapping's
    /// file range, but for one the mapping starts below the page of, or one it covers less than
    /// a page of before going a page past it; of several, the one holding `file_offset`. This
    /// places a file whose code was cut out (a Go program stripped down to its line table):
    /// its later segments moved in the file, so an address's file offset lands in the wrong one.
    fn segment_of_mapping(&self, mapping: MappingRange, file_offset: u64) -> Option<(u64, u64)> {
        const PAGE: u64 = 0x1000;
        let map_off = mapping.offset;
        let map_limit = map_off.saturating_add(mapping.limit - mapping.start);
        let mut found = self.segments.iter().filter_map(|s| {
            let offset = s.offset?;
            let seg_limit = offset.saturating_add(s.memsz);
            let aligned = offset.saturating_sub(s.vaddr & (PAGE - 1));
            let overlaps = map_off < seg_limit && offset < map_limit;
            let other = map_off < aligned
                || (map_off > offset
                    && seg_limit < map_off.saturating_add(PAGE)
                    && map_limit >= seg_limit.saturating_add(PAGE));
            (overlaps && !other).then_some((offset, s.vaddr, seg_limit))
        });
        let first = found.next()?;
        let Some(second) = found.next() else {
            return Some((first.0, first.1));
        };
        let mut holding = [first, second]
            .into_iter()
            .chain(found)
            .filter(|&(offset, _, limit)| offset <= file_offset && file_offset < limit);
        match (holding.next(), holding.next()) {
            (Some((offset, vaddr, _)), None) => Some((offset, vaddr)),
            _ => None,
        }
    }

    /// The frames at `address` (in the file's own address space), innermost first: DWARF's
    /// (with inlined frames), else Go's line table, else the symbol table's function. Empty
    /// when nothing names it.
    ///
    /// The file is a client's: `addr2line` and `gimli` may panic on a damaged one (an
    /// arithmetic overflow, in debug builds). A panic is contained here: the file's DWARF is
    /// not read again, and the Go table and symbol table still answer.
    pub fn resolve(&self, address: u64) -> Vec<Frame> {
        use std::sync::atomic::Ordering;
        let loader = self.loader.lock().unwrap_or_else(|e| e.into_inner());
        // `addr2line` looks up `[address, address + 1)`: the last address overflows there (a
        // panic where overflow is checked, which would mark a good file's DWARF broken), and no
        // code lies at it.
        if self.has_dwarf && address < u64::MAX && !self.dwarf_broken.load(Ordering::Relaxed) {
            let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dwarf_frames(&loader, address)
            }));
            match found {
                Ok(frames) if !frames.is_empty() => return frames,
                Ok(_) => {}
                Err(_) => self.dwarf_broken.store(true, Ordering::Relaxed),
            }
        }
        if let Some(g) = self.go.as_ref().and_then(|g| g.lookup(address)) {
            return vec![Frame {
                function: g.function,
                file: g.file,
                line: g.line,
            }];
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            loader.find_symbol(address).map(|name| Frame {
                function: demangle(name),
                file: None,
                line: 0,
            })
        }))
        .ok()
        .flatten()
        .into_iter()
        .collect()
    }

    /// Whether reading this file's DWARF panicked (it is damaged; see [`Self::resolve`]).
    pub fn dwarf_broken(&self) -> bool {
        self.dwarf_broken.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn dwarf_frames(loader: &addr2line::Loader, address: u64) -> Vec<Frame> {
    {
        let Ok(mut frames) = loader.find_frames(address) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // A frame without a function name (DWARF that covers the address only by its line
        // table) takes the symbol table's name.
        while let Ok(Some(frame)) = frames.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok().map(|n| n.into_owned()))
                .or_else(|| loader.find_symbol(address).map(demangle));
            let Some(function) = function else {
                continue;
            };
            let (file, line) = frame
                .location
                .map(|l| (l.file.map(str::to_owned), l.line.unwrap_or(0)))
                .unwrap_or((None, 0));
            out.push(Frame {
                function,
                file,
                line,
            });
        }
        out
    }
}

/// The loadable segments of a file. A debug-only file (`objcopy --only-keep-debug`) keeps the
/// program headers but not the bytes of the segments (their file size is 0, their offset made
/// up): those offsets are unknown (`None`).
fn load_segments<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Vec<Segment> {
    let mut segments: Vec<Segment> = obj
        .segments()
        .map(|s| {
            let (offset, file_size) = s.file_range();
            Segment {
                offset: (file_size > 0).then_some(offset),
                vaddr: s.address(),
                memsz: s.size(),
                executable: matches!(
                    s.flags(),
                    object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0
                ),
            }
        })
        .collect();
    segments.sort_by_key(|s| s.vaddr);
    segments
}

fn probe_addresses<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Vec<u64> {
    let functions: Vec<u64> = obj
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
        .map(|s| s.address())
        .collect();
    let step = (functions.len() / 32).max(1);
    functions.into_iter().step_by(step).take(32).collect()
}

/// A symbol's name demangled (Rust legacy and v0, C++), or as it is.
pub fn demangle(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

/// Go's line table, when the file has one (its own section, the PIE one, or between the
/// `runtime.pclntab` and `runtime.epclntab` symbols).
fn go_table<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> Result<Option<GoLineTable>> {
    let section = obj
        .section_by_name(".gopclntab")
        .or_else(|| obj.section_by_name(".data.rel.ro.gopclntab"))
        .filter(|s| s.kind() != object::SectionKind::UninitializedData);
    let Some(section) = section else {
        return Ok(None);
    };
    let data = section
        .uncompressed_data()
        .map_err(|e| Error::Damaged(format!("the Go line table: {e}")))?
        .into_owned();
    if data.is_empty() {
        return Ok(None);
    }
    let text_start = symbol_address(obj, b"runtime.text")
        .or_else(|| obj.section_by_name(".text").map(|s| s.address()))
        .unwrap_or(0);
    GoLineTable::parse(data, obj.is_little_endian(), text_start).map(Some)
}

/// The address of the symbol table's symbol `name`. Names are compared within the string
/// table's bytes, read once: the lazy view caches each name it reads on its own (up to 4 KiB),
/// so many symbols of long names would cost far more than the file's size.
fn symbol_address<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
    name: &[u8],
) -> Option<u64> {
    match obj {
        object::File::Elf32(f) => elf_symbol_address(f, name),
        object::File::Elf64(f) => elf_symbol_address(f, name),
        _ => None,
    }
}

fn elf_symbol_address<'d, Elf, R>(
    file: &object::read::elf::ElfFile<'d, Elf, R>,
    name: &[u8],
) -> Option<u64>
where
    Elf: object::read::elf::FileHeader,
    R: object::ReadRef<'d>,
{
    use object::read::elf::Sym;
    let table = file.elf_symbol_table();
    let strings = file
        .section_by_index(table.string_section())
        .ok()?
        .data()
        .ok()?;
    let endian = file.endian();
    table.symbols().iter().find_map(|sym| {
        let at = usize::try_from(sym.st_name(endian)).ok()?;
        let rest = strings.get(at..)?;
        (rest.strip_prefix(name)?.first() == Some(&0)).then(|| sym.st_value(endian).into())
    })
}
