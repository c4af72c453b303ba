//! Real binaries for tests, built at test time with the machine's compilers (gcc, g++, rustc, go)
//! and split as distributions split them (`objcopy --only-keep-debug`, `strip`), and the
//! independent oracles that name their addresses: binutils' `addr2line -f -i -C` and
//! `go tool addr2line`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Frame;

/// A program as built, and its split halves.
#[derive(Debug, Clone)]
pub struct Built {
    /// The program with its debug information.
    pub full: PathBuf,
    /// `objcopy --only-keep-debug` of it.
    pub debug: PathBuf,
    /// `strip` of it: what runs on a host.
    pub stripped: PathBuf,
    /// Functions of the program's own source (names as the symbol table has them).
    pub functions: Vec<String>,
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a tool is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        || Command::new(tool)
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Splits `full` into a debug-only file and a stripped program beside it.
pub fn split(full: &Path) -> Result<(PathBuf, PathBuf), String> {
    let debug = full.with_extension("debug");
    let stripped = full.with_extension("stripped");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(full)
        .arg(&debug))?;
    run(Command::new("strip").arg("-o").arg(&stripped).arg(full))?;
    Ok((debug, stripped))
}

/// A C program whose hot loop inlines two levels of static functions at -O2.
pub const C_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>

static inline long leaf(long x) {
    long y = x * 2654435761u;
    return y ^ (y >> 13);
}

static inline long middle(long x) {
    long s = 0;
    for (int i = 0; i < 4; i++) {
        s += leaf(x + i);
    }
    return s;
}

__attribute__((noinline)) long work(long n) {
    long acc = 0;
    for (long i = 0; i < n; i++) {
        acc += middle(acc + i);
    }
    return acc;
}

__attribute__((noinline)) long other(long n) {
    return work(n / 2) + 1;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    printf("%ld\n", work(n) + other(n));
    return 0;
}
"#;

/// A C library (position-independent, shared).
pub const LIB_SOURCE: &str = r#"
static inline int twice(int x) { return x * 2 + (x >> 3); }

__attribute__((noinline)) int lib_sum(const int *v, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        s += twice(v[i]);
    }
    return s;
}

__attribute__((noinline)) int lib_max(const int *v, int n) {
    int m = v[0];
    for (int i = 1; i < n; i++) {
        if (v[i] > m) m = v[i];
    }
    return m;
}
"#;

/// A C++ program: templates, a namespace, a method, inlined at -O2.
pub const CPP_SOURCE: &str = r#"
#include <cstdio>
#include <vector>

namespace shop {
template <typename T>
struct Basket {
    std::vector<T> items;
    T total() const {
        T s = 0;
        for (const auto &x : items) s += x * 3 / 2;
        return s;
    }
};

__attribute__((noinline)) long checkout(int n) {
    Basket<long> b;
    for (int i = 0; i < n; i++) b.items.push_back(i);
    return b.total();
}
}

int main(int argc, char **) {
    std::printf("%ld\n", shop::checkout(1000 + argc));
    return 0;
}
"#;

/// A Rust program with a generic and an inlined closure.
pub const RUST_SOURCE: &str = r#"
#[inline(never)]
fn crunch(n: u64) -> u64 {
    (0..n).map(|i| mix(i)).fold(0, |a, b| a.wrapping_add(b))
}

#[inline(always)]
fn mix(x: u64) -> u64 {
    let y = x.wrapping_mul(0x9e3779b97f4a7c15);
    y ^ (y >> 29)
}

#[inline(never)]
fn outer(n: u64) -> u64 {
    crunch(n) ^ crunch(n / 3)
}

fn main() {
    let n = std::env::args().count() as u64 * 1000;
    println!("{}", outer(n));
}
"#;

/// A Go program.
pub const GO_SOURCE: &str = r#"
package main

import (
	"fmt"
	"os"
)

//go:noinline
func work(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += mix(i)
	}
	return s
}

func mix(x int) int {
	y := x * 2654435761
	return y ^ (y >> 13)
}

//go:noinline
func other(n int) int {
	return work(n/2) + len(os.Args)
}

func main() {
	fmt.Println(work(1000) + other(1000))
}
"#;

/// The function of a Go source (as `main.<name>`) whose body holds `line` (1-based): the
/// oracle for the names of inlined Go frames, which binutils gets wrong (it names an inlined
/// call by its caller at some addresses).
pub fn go_function_at_line(source: &str, line: u32) -> Option<String> {
    let mut current = None;
    for (i, text) in source.lines().enumerate() {
        if let Some(rest) = text.strip_prefix("func ") {
            current = rest.split('(').next().map(|n| format!("main.{n}"));
        }
        if i as u32 + 1 == line {
            return current;
        }
    }
    None
}

/// The kinds of program the tests build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// C at -O2, position-dependent.
    C,
    /// C at -O2, a position-independent executable.
    CPie,
    /// A C shared library.
    CShared,
    Cpp,
    Rust,
    /// Go with DWARF.
    Go,
    /// Go built with `-ldflags=-w`: no DWARF, only `.gopclntab` and the symbol table.
    GoNoDwarf,
}

impl Program {
    /// The functions of the program's own source, as `nm -C` names them.
    fn functions(self) -> Vec<&'static str> {
        match self {
            Self::C | Self::CPie => vec!["work", "other", "main"],
            Self::CShared => vec!["lib_sum", "lib_max"],
            Self::Cpp => vec!["shop::checkout(int)", "main"],
            Self::Rust => vec!["rust::crunch", "rust::outer"],
            Self::Go | Self::GoNoDwarf => vec!["main.work", "main.other", "main.main"],
        }
    }
}

/// The magic number opening a file's `.gopclntab` (its layout: `0xfffffffb` for Go 1.2 to 1.15).
pub fn gopclntab_magic(path: &Path) -> Option<u32> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let section = file.section_by_name(".gopclntab")?.data().ok()?;
    let head: [u8; 4] = section.get(..4)?.try_into().ok()?;
    Some(if file.is_little_endian() {
        u32::from_le_bytes(head)
    } else {
        u32::from_be_bytes(head)
    })
}

/// Builds `program` in `dir` and splits it.
pub fn build(program: Program, dir: &Path) -> Result<Built, String> {
    build_with_go(program, dir, Path::new("go"))
}

/// [`build`], with the Go toolchain `go` for the Go programs (an older release's, say).
pub fn build_with_go(program: Program, dir: &Path, go: &Path) -> Result<Built, String> {
    let name = format!("{program:?}").to_lowercase();
    let full = dir.join(&name);
    match program {
        Program::C | Program::CPie | Program::CShared => {
            let (src, flags): (&str, &[&str]) = match program {
                Program::C => (C_SOURCE, &["-no-pie"]),
                Program::CPie => (C_SOURCE, &["-pie", "-fPIE"]),
                _ => (LIB_SOURCE, &["-shared", "-fPIC"]),
            };
            let source = dir.join(format!("{name}.c"));
            std::fs::write(&source, src).map_err(|e| e.to_string())?;
            run(Command::new("gcc")
                .args(["-O2", "-g"])
                .args(flags)
                .arg("-o")
                .arg(&full)
                .arg(&source))?;
        }
        Program::Cpp => {
            let source = dir.join("cpp.cpp");
            std::fs::write(&source, CPP_SOURCE).map_err(|e| e.to_string())?;
            run(Command::new("g++")
                .args(["-O2", "-g", "-o"])
                .arg(&full)
                .arg(&source))?;
        }
        Program::Rust => {
            let source = dir.join("rust.rs");
            std::fs::write(&source, RUST_SOURCE).map_err(|e| e.to_string())?;
            run(Command::new("rustc")
                .args(["-C", "opt-level=2", "-C", "debuginfo=2", "-o"])
                .arg(&full)
                .arg(&source))?;
        }
        Program::Go | Program::GoNoDwarf => {
            let module = dir.join(format!("{name}-src"));
            std::fs::create_dir_all(&module).map_err(|e| e.to_string())?;
            std::fs::write(module.join("main.go"), GO_SOURCE).map_err(|e| e.to_string())?;
            // The oldest release the tests build with (Go 1.15) reads this directive.
            std::fs::write(module.join("go.mod"), "module kilntest\n\ngo 1.15\n")
                .map_err(|e| e.to_string())?;
            let mut cmd = Command::new(go);
            cmd.current_dir(&module)
                .env("GOCACHE", dir.join("gocache"))
                .env("GOPATH", dir.join("gopath"))
                .env("GOFLAGS", "-mod=mod")
                .env("CGO_ENABLED", "0")
                .args(["build", "-o"])
                .arg(&full);
            if program == Program::GoNoDwarf {
                cmd.arg("-ldflags=-w");
            }
            run(cmd.arg("."))?;
        }
    }
    let (debug, stripped) = split(&full)?;
    Ok(Built {
        full,
        debug,
        stripped,
        functions: program.functions().into_iter().map(String::from).collect(),
    })
}

/// Addresses inside the named functions of a file (from `nm -S -C`): each function's start
/// and points through it, `per_function` of them.
pub fn addresses_in(path: &Path, functions: &[String], per_function: u64) -> Vec<u64> {
    let out = run(Command::new("nm")
        .args(["-S", "-C", "--defined-only"])
        .arg(path))
    .unwrap_or_default();
    let mut addrs = Vec::new();
    for line in out.lines() {
        let parts: Vec<&str> = line.splitn(4, ' ').collect();
        let [addr, size, kind, name] = parts[..] else {
            continue;
        };
        if !matches!(kind, "T" | "t") || !functions.iter().any(|f| f == name) {
            continue;
        }
        let (Ok(addr), Ok(size)) = (u64::from_str_radix(addr, 16), u64::from_str_radix(size, 16))
        else {
            continue;
        };
        for i in 0..per_function {
            addrs.push(addr + size * i / per_function);
        }
    }
    addrs.sort_unstable();
    addrs.dedup();
    addrs
}

/// What binutils' `addr2line -f -i -C -e path` says of each address: frames innermost first,
/// `??` and `?` read as unknown (no frames, no file, line 0), discriminators dropped.
pub fn addr2line(path: &Path, addrs: &[u64]) -> Result<Vec<Vec<Frame>>, String> {
    let mut cmd = Command::new("addr2line");
    cmd.args(["-a", "-f", "-i", "-C", "-e"]).arg(path);
    for a in addrs {
        cmd.arg(format!("{a:#x}"));
    }
    let out = run(&mut cmd)?;
    let mut result: Vec<Vec<Frame>> = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("0x") {
            result.push(Vec::new());
            continue;
        }
        let function = line.to_owned();
        let location = lines.next().unwrap_or("??:0");
        let location = location.split(" (discriminator").next().unwrap_or(location);
        let (file, number) = location.rsplit_once(':').unwrap_or((location, "0"));
        let frames = result.last_mut().ok_or("output before an address")?;
        if function == "??" {
            continue;
        }
        frames.push(Frame {
            function,
            file: (file != "??").then(|| file.to_owned()),
            line: number.parse().unwrap_or(0),
        });
    }
    Ok(result)
}

/// What `go tool addr2line` says of each address (one frame: function, file, line).
pub fn go_addr2line(path: &Path, addrs: &[u64]) -> Result<Vec<Vec<Frame>>, String> {
    go_addr2line_with(Path::new("go"), path, addrs)
}

/// [`go_addr2line`] of the Go toolchain `go`.
pub fn go_addr2line_with(go: &Path, path: &Path, addrs: &[u64]) -> Result<Vec<Vec<Frame>>, String> {
    use std::io::Write;
    let mut child = Command::new(go)
        .args(["tool", "addr2line"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    {
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        for a in addrs {
            writeln!(stdin, "{a:#x}").map_err(|e| e.to_string())?;
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    Ok(lines
        .chunks(2)
        .map(|pair| {
            let function = pair[0];
            let (file, line) = pair
                .get(1)
                .and_then(|l| l.rsplit_once(':'))
                .unwrap_or(("?", "0"));
            if function == "?" {
                Vec::new()
            } else {
                vec![Frame {
                    function: function.to_owned(),
                    file: (file != "?").then(|| file.to_owned()),
                    line: line.parse().unwrap_or(0),
                }]
            }
        })
        .collect())
}

/// The first executable `LOAD` segment of a file (from `readelf -lW`): file offset, virtual
/// address and size in memory.
pub fn executable_segment(path: &Path) -> Result<(u64, u64, u64), String> {
    let out = run(Command::new("readelf").arg("-lW").arg(path))?;
    for line in out.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.first() != Some(&"LOAD") || !parts.iter().any(|p| p.contains('E')) {
            continue;
        }
        let num = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        let (Some(offset), Some(vaddr), Some(memsz)) =
            (num(parts[1]), num(parts[2]), num(parts[5]))
        else {
            continue;
        };
        return Ok((offset, vaddr, memsz));
    }
    Err(format!("{}: no executable LOAD segment", path.display()))
}

/// The address of a file's first loadable segment (`readelf -lW`), which holds its ELF header.
pub fn first_load_vaddr(path: &Path) -> Result<u64, String> {
    let out = run(Command::new("readelf").arg("-lW").arg(path))?;
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|parts| parts.first() == Some(&"LOAD"))
        .and_then(|parts| u64::from_str_radix(parts.get(2)?.trim_start_matches("0x"), 16).ok())
        .ok_or_else(|| format!("{}: no LOAD segment", path.display()))
}

/// Debian's `debuginfod` serving the ELF files of a directory on a free loopback port.
pub struct DebuginfodServer {
    child: Option<std::process::Child>,
    pub port: u16,
    dir: PathBuf,
    db: PathBuf,
}

impl DebuginfodServer {
    /// Starts the server over `dir` (its files scanned at start and every second).
    pub fn start(dir: &Path, scratch: &Path) -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| e.to_string())?;
        let mut s = Self {
            child: None,
            port,
            dir: dir.to_owned(),
            db: scratch.join(format!("debuginfod-{port}.sqlite")),
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new("debuginfod")
            .args(["-F", "-t", "1", "-g", "0", "-p"])
            .arg(self.port.to_string())
            .arg("-d")
            .arg(&self.db)
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("debuginfod: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the server serves `build_id`'s debug information (it scans first).
    pub fn wait_for(&self, build_id: &str) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let path = format!("/buildid/{build_id}/debuginfo");
        while std::time::Instant::now() < deadline {
            if http_status(self.port, &path) == Some(200) {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        Err(format!("debuginfod did not serve {build_id} within 60 s"))
    }

    /// Stops the server (its port refuses connections until [`Self::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()
    }
}

impl Drop for DebuginfodServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The status of a plain HTTP/1.0 GET to 127.0.0.1 (`None` when nothing answers).
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// A compression of ELF sections (`objcopy --compress-debug-sections=…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Zlib,
    Zstd,
}

impl Compression {
    fn objcopy_name(self) -> &'static str {
        match self {
            Self::Zlib => "zlib",
            Self::Zstd => "zstd",
        }
    }

    /// `ch_type` of an `Elf64_Chdr`.
    fn ch_type(self) -> u32 {
        match self {
            Self::Zlib => 1,
            Self::Zstd => 2,
        }
    }
}

/// `objcopy --compress-debug-sections` of `path`, beside it.
pub fn compress(path: &Path, how: Compression) -> Result<PathBuf, String> {
    let out = path.with_extension(format!("{}.elf", how.objcopy_name()));
    run(Command::new("objcopy")
        .arg(format!("--compress-debug-sections={}", how.objcopy_name()))
        .arg(path)
        .arg(&out))?;
    Ok(out)
}

/// An inflation bomb made of a real program: `compressed` (an `objcopy
/// --compress-debug-sections` file, 64-bit little-endian) with its `.debug_info` re-pointed at
/// a stream of `declared` zero bytes, appended to the file. A zlib stream of 3 GiB is about
/// 3 MB; a zstd one (run-length blocks), about 100 KB.
pub fn inflation_bomb(
    compressed: &Path,
    how: Compression,
    declared: u64,
) -> Result<Vec<u8>, String> {
    use object::{Object, ObjectSection};
    let mut data = std::fs::read(compressed).map_err(|e| e.to_string())?;
    let index = {
        let file = object::File::parse(&*data).map_err(|e| e.to_string())?;
        file.section_by_name(".debug_info")
            .ok_or("no .debug_info")?
            .index()
            .0
    };
    let u16_at = |d: &[u8], at: usize| u16::from_le_bytes([d[at], d[at + 1]]) as usize;
    let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().unwrap()) as usize;
    let header = shoff + index * u16_at(&data, 0x3a);
    // Elf64_Chdr: type, reserved, size, alignment; then the stream.
    let mut section = Vec::new();
    section.extend_from_slice(&how.ch_type().to_le_bytes());
    section.extend_from_slice(&0u32.to_le_bytes());
    section.extend_from_slice(&declared.to_le_bytes());
    section.extend_from_slice(&1u64.to_le_bytes());
    section.extend_from_slice(&match how {
        Compression::Zlib => zlib_zeros(declared),
        Compression::Zstd => zstd_zeros(declared),
    });
    let offset = data.len().next_multiple_of(8);
    data.resize(offset, 0);
    data.extend_from_slice(&section);
    // sh_offset and sh_size of the section's header.
    data[header + 0x18..header + 0x20].copy_from_slice(&(offset as u64).to_le_bytes());
    data[header + 0x20..header + 0x28].copy_from_slice(&(section.len() as u64).to_le_bytes());
    Ok(data)
}

/// A zlib stream of `n` zero bytes (`n` a multiple of 1 MiB or not): one fully flushed deflate
/// block of 1 MiB of zeros repeated (each copy refers back only to zeros), the rest, the end.
fn zlib_zeros(n: u64) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    const CHUNK: usize = 1 << 20;
    let deflate = |len: usize, flush: FlushCompress| {
        let mut c = Compress::new(Compression::best(), false);
        let mut out = Vec::with_capacity(len / 64 + 64);
        c.compress_vec(&vec![0u8; len], &mut out, flush)
            .expect("deflate of zeros");
        out
    };
    let mut out = vec![0x78, 0xda];
    let chunk = deflate(CHUNK, FlushCompress::Full);
    for _ in 0..n / CHUNK as u64 {
        out.extend_from_slice(&chunk);
    }
    out.extend_from_slice(&deflate((n % CHUNK as u64) as usize, FlushCompress::Finish));
    // Adler-32 of zeros: a stays 1, b adds it once a byte.
    let b = (n % 65_521) as u32;
    out.extend_from_slice(&((b << 16) | 1).to_be_bytes());
    out
}

/// A zstd frame of `n` zero bytes: run-length blocks of 128 KiB.
fn zstd_zeros(n: u64) -> Vec<u8> {
    const BLOCK: u64 = 128 << 10;
    // Magic; an 8-byte content size and a window descriptor (2^17); the size.
    let mut out = vec![0x28, 0xb5, 0x2f, 0xfd, 0xc0, 7 << 3];
    out.extend_from_slice(&n.to_le_bytes());
    let mut left = n;
    loop {
        let size = left.min(BLOCK);
        left -= size;
        let last = u32::from(left == 0);
        // Block header: last flag, type 1 (RLE), size; then the byte repeated.
        let header = last | (1 << 1) | ((size as u32) << 3);
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.push(0);
        if left == 0 {
            return out;
        }
    }
}
