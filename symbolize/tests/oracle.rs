//! Kiln's symbolizer against independent oracles on real binaries built here: every name, file
//! and line (inlined frames included) equal to what binutils' `addr2line -f -i -C` prints, and
//! for a Go program without DWARF to what `go tool addr2line` prints.

use kiln_symbolize::testing::{self, Program};
use kiln_symbolize::{DebugFile, FileKind, Frame, MappingRange, OpenLimits, identify_file};

const LIMITS: OpenLimits = OpenLimits {
    max_inflated_bytes: 512 << 20,
};

/// Resolves `addrs` in `file` with Kiln and with the oracle, and compares them all.
fn compare(file: &std::path::Path, addrs: &[u64], oracle: &[Vec<Frame>]) {
    let debug = DebugFile::open(file, LIMITS).unwrap();
    assert_eq!(addrs.len(), oracle.len());
    let mut named = 0;
    let mut inlined = 0;
    for (addr, want) in addrs.iter().zip(oracle) {
        let got = debug.resolve(*addr);
        assert_eq!(&got, want, "{} at {addr:#x}", file.display());
        named += usize::from(!got.is_empty());
        inlined += usize::from(got.len() > 1);
    }
    assert!(named * 2 >= addrs.len(), "{named} of {} named", addrs.len());
    eprintln!(
        "{}: {} addresses, {named} named, {inlined} with inlined frames",
        file.display(),
        addrs.len()
    );
}

fn check_program(program: Program, expect_inlining: bool) {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(program, dir.path()).unwrap();
    // The split halves carry the same GNU build id; the debug half holds no code.
    let full = identify_file(&built.full).unwrap();
    let debug = identify_file(&built.debug).unwrap();
    let stripped = identify_file(&built.stripped).unwrap();
    assert_eq!(full.kind, FileKind::Executable);
    assert_eq!(debug.kind, FileKind::DebugOnly, "{program:?}");
    assert_eq!(stripped.kind, FileKind::Executable);
    assert!(debug.has_dwarf && !stripped.has_dwarf);
    assert_eq!(debug.gnu_build_id, stripped.gnu_build_id);
    assert_ne!(
        debug.file_id, stripped.file_id,
        "the file id is of the bytes"
    );
    let addrs = testing::addresses_in(&built.full, &built.functions, 24);
    assert!(addrs.len() >= 24, "{program:?}: {addrs:?}");
    let oracle = testing::addr2line(&built.debug, &addrs).unwrap();
    compare(&built.debug, &addrs, &oracle);
    if expect_inlining {
        assert!(
            oracle.iter().any(|f| f.len() > 1),
            "{program:?}: the oracle shows no inlined frame"
        );
    }
}

#[test]
fn c_at_o2_with_inlining() {
    check_program(Program::C, true);
}

/// The last address leaves the file's DWARF readable (cargo fuzz found that `addr2line`
/// overflows on it where overflow is checked, which marked the DWARF broken).
#[test]
fn the_last_address_leaves_the_files_dwarf_readable() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let addrs = testing::addresses_in(&built.full, &built.functions, 2);
    let oracle = testing::addr2line(&built.debug, &addrs).unwrap();
    let debug = DebugFile::open(&built.debug, LIMITS).unwrap();
    let _ = debug.resolve(u64::MAX);
    assert!(!debug.dwarf_broken());
    let named: Vec<Vec<Frame>> = addrs.iter().map(|&a| debug.resolve(a)).collect();
    assert_eq!(named, oracle);
}

#[test]
fn c_position_independent() {
    check_program(Program::CPie, true);
}

#[test]
fn c_shared_library() {
    check_program(Program::CShared, true);
}

#[test]
fn cpp() {
    check_program(Program::Cpp, true);
}

#[test]
fn rust() {
    check_program(Program::Rust, true);
}

#[test]
fn go_with_dwarf() {
    if !testing::have("go") {
        kiln_otel::skip::missing("go");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::Go, dir.path()).unwrap();
    let info = identify_file(&built.stripped).unwrap();
    assert!(info.go_build_id.is_some() && info.has_gopclntab);
    // main.main is left out: it inlines the standard library, whose names the source map
    // below cannot check.
    let functions = ["main.work".to_owned(), "main.other".to_owned()];
    let addrs = testing::addresses_in(&built.full, &functions, 24);
    // Files and lines from binutils; the names of inlined frames from the source (binutils
    // names some inlined Go calls by their caller); the outermost name also from Go's tool.
    let mut oracle = testing::addr2line(&built.full, &addrs).unwrap();
    for frames in &mut oracle {
        for f in frames.iter_mut() {
            if let Some(name) = testing::go_function_at_line(testing::GO_SOURCE, f.line) {
                f.function = name;
            }
        }
    }
    let go = testing::go_addr2line(&built.full, &addrs).unwrap();
    for (frames, go) in oracle.iter().zip(&go) {
        assert_eq!(
            frames.last().map(|f| &f.function),
            go.first().map(|f| &f.function)
        );
    }
    assert!(oracle.iter().any(|f| f.len() > 1), "no inlined frame");
    compare(&built.full, &addrs, &oracle);
}

#[test]
fn go_without_dwarf_through_gopclntab() {
    if !testing::have("go") {
        kiln_otel::skip::missing("go");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::GoNoDwarf, dir.path()).unwrap();
    let info = identify_file(&built.full).unwrap();
    assert!(!info.has_dwarf && info.has_gopclntab);
    // Go's own ids: the build id note as `go tool buildid` prints it.
    let buildid = std::process::Command::new("go")
        .args(["tool", "buildid"])
        .arg(&built.full)
        .output()
        .unwrap();
    assert_eq!(
        info.go_build_id.as_deref(),
        Some(String::from_utf8_lossy(&buildid.stdout).trim())
    );
    let addrs = testing::addresses_in(&built.full, &built.functions, 16);
    let oracle = testing::go_addr2line(&built.full, &addrs).unwrap();
    compare(&built.full, &addrs, &oracle);
    // Stripped of its symbol table too (`strip`), the line table still names everything.
    compare(&built.stripped, &addrs, &oracle);
}

/// A Go 1.15 program without DWARF: its line table has Go 1.2's layout (one table, offsets from
/// its start, files numbered for the whole table), which Go has not written since 1.16. Every
/// address names what Go 1.15's own `go tool addr2line` names, stripped of symbols too.
#[test]
fn go_1_15_through_its_go_1_2_line_table() {
    let go = std::env::var_os("KILN_TEST_GO115").map(std::path::PathBuf::from);
    let Some(go) = go.filter(|g| g.is_file()) else {
        kiln_otel::skip::missing("Go 1.15 (KILN_TEST_GO115, installed by the test command)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build_with_go(Program::GoNoDwarf, dir.path(), &go).unwrap();
    assert_eq!(testing::gopclntab_magic(&built.full), Some(0xffff_fffb));
    let info = identify_file(&built.full).unwrap();
    assert!(!info.has_dwarf && info.has_gopclntab);
    let addrs = testing::addresses_in(&built.full, &built.functions, 16);
    let oracle = testing::go_addr2line_with(&go, &built.full, &addrs).unwrap();
    compare(&built.full, &addrs, &oracle);
    compare(&built.stripped, &addrs, &oracle);
}

/// A Go program stripped down to its line table (its code and read-only data cut out, as in
/// Parca's symbolizer test files): its later segments moved in the file, so an address placed
/// by its file offset alone lands in the wrong segment. Placed through the segment its mapping
/// maps, each process address names what `go tool addr2line` names in the whole program.
#[test]
fn a_go_program_stripped_to_its_line_table_names_process_addresses() {
    for tool in ["go", "objcopy"] {
        if !testing::have(tool) {
            kiln_otel::skip::missing(tool);
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::GoNoDwarf, dir.path()).unwrap();
    let cut = dir.path().join("line-table-only");
    let status = std::process::Command::new("objcopy")
        .args(["--remove-section=.text", "--remove-section=.rodata"])
        .arg(&built.full)
        .arg(&cut)
        .status()
        .unwrap();
    assert!(status.success());
    let info = identify_file(&cut).unwrap();
    assert!(info.has_gopclntab && !info.has_dwarf);
    let addrs = testing::addresses_in(&built.full, &built.functions, 16);
    let oracle = testing::go_addr2line(&built.full, &addrs).unwrap();
    // The code's segment as /proc/<pid>/maps shows it (from offset 0 in a Go program).
    let (offset, vaddr, memsz) = testing::executable_segment(&built.full).unwrap();
    let page = |v: u64| v & !0xfff;
    let mapping = MappingRange {
        start: page(vaddr),
        limit: vaddr + memsz,
        offset: page(offset),
    };
    let debug = DebugFile::open(&cut, LIMITS).unwrap();
    let mut named = 0;
    for (&a, want) in addrs.iter().zip(&oracle) {
        let got = debug.resolve(debug.file_address(mapping, a));
        assert_eq!(&got, want, "{a:#x}");
        named += usize::from(!got.is_empty());
    }
    assert!(named * 2 >= addrs.len(), "{named} of {} named", addrs.len());
}

/// A program's addresses as a process sees them (the PIE and the library loaded at a bias),
/// mapped back to the file through the mapping's start and offset, resolve as the file's own.
#[test]
fn process_addresses_map_back_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for program in [
        Program::CPie,
        Program::CShared,
        Program::C,
        Program::Rust,
        Program::Cpp,
    ] {
        let built = testing::build(program, dir.path()).unwrap();
        let debug = DebugFile::open(&built.debug, LIMITS).unwrap();
        let addrs = testing::addresses_in(&built.full, &built.functions, 8);
        // The executable segment from the program headers, as /proc/<pid>/maps would show it.
        let (offset, vaddr, memsz) = testing::executable_segment(&built.full).unwrap();
        let bias = if program == Program::C {
            0
        } else {
            0x7f12_3400_0000
        };
        let page = |v: u64| v & !0xfff;
        let mapping = MappingRange {
            start: page(vaddr) + bias,
            limit: vaddr + memsz + bias,
            offset: page(offset),
        };
        for &a in &addrs {
            let process = a + bias;
            assert_eq!(
                debug.file_address(mapping, process),
                a,
                "{program:?} {a:#x}"
            );
            // The OpenTelemetry eBPF profiler's form: mapping and address in the file's space.
            let file_space = MappingRange {
                start: page(vaddr),
                limit: vaddr + memsz,
                offset: page(offset),
            };
            assert_eq!(debug.file_address(file_space, a), a);
            assert_eq!(debug.file_address(MappingRange::default(), a), a);
        }
    }
}

#[test]
fn debug_files_are_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DebugFile>();
}
