use bytes::Bytes;
use kiln_otel::model::Symbols as ProfileSymbols;
use kiln_otel::model::{Function, Line, Location};
use kiln_proto::kiln::storage::v1 as pb;
use prost::Message;

use super::codec::{function_columns, functions_of_columns, sealed};
use super::*;
use crate::error::DecodeError;
use crate::format::tiers::Pages;

fn profile_symbols(names: &[&str]) -> ProfileSymbols {
    let mut s = ProfileSymbols::default();
    for (i, n) in names.iter().enumerate() {
        s.functions.push(Function {
            name: (*n).into(),
            ..Default::default()
        });
        s.locations.push(Location {
            lines: kiln_otel::model::smallvec![Line {
                function: i as u32,
                line: 1,
            }],
            ..Default::default()
        });
    }
    s
}

/// The name trie merges locations of one function (other lines, other addresses), splits
/// inlined lines into a node each, and leaves a location without lines out.
#[test]
fn name_trie_folds_stacks_by_function_name() {
    let mut s = profile_symbols(&["main", "work", "inlined"]);
    // main at another line; work with `inlined` inlined into it (innermost first); and an
    // unsymbolized address.
    s.locations.push(Location {
        lines: kiln_otel::model::smallvec![Line {
            function: 0,
            line: 7,
        }],
        ..Default::default()
    });
    s.locations.push(Location {
        lines: kiln_otel::model::smallvec![
            Line {
                function: 2,
                line: 3,
            },
            Line {
                function: 1,
                line: 4,
            },
        ],
        ..Default::default()
    });
    s.locations.push(Location {
        address: 0xdead,
        ..Default::default()
    });
    let mut b = SymbolsBuilder::default();
    let map = b.add_locations(&s);
    let stack = |b: &mut SymbolsBuilder, root_first: &[usize]| {
        b.add_stack(root_first.iter().rev().map(|&l| map[l]))
    };
    let a = stack(&mut b, &[0, 1]);
    let other_line = stack(&mut b, &[3, 1]);
    let inlined = stack(&mut b, &[0, 4]);
    let address = stack(&mut b, &[0, 1, 5]);
    let t = SymbolTable::decode(&b.encode().unwrap()).unwrap();
    let trie = t.name_trie();
    let name = |node: u32| t.string(trie.names[trie.names_of[node as usize] as usize]);
    let path = |stack: u32| {
        let mut out = Vec::new();
        let mut node = trie.of_stack[stack as usize];
        while node != 0 {
            out.push(name(node));
            node = trie.parents[node as usize];
        }
        out.reverse();
        out
    };
    assert_eq!(path(a), ["main", "work"]);
    assert_eq!(
        trie.of_stack[other_line as usize],
        trie.of_stack[a as usize]
    );
    assert_eq!(path(inlined), ["main", "work", "inlined"]);
    assert_eq!(trie.of_stack[address as usize], trie.of_stack[a as usize]);
    // root, main, main/work, main/work/inlined
    assert_eq!(trie.len(), 4);
    assert_eq!(trie.names.len(), 3);
    for (i, &n) in trie.names.iter().enumerate() {
        assert_eq!(trie.name_hashes[i], string_hash(t.string(n)));
    }
}

#[test]
fn stacks_share_prefixes_and_round_trip() {
    let mut b = SymbolsBuilder::default();
    let map = b.add_locations(&profile_symbols(&["main", "a", "b"]));
    let map2 = b.add_locations(&profile_symbols(&["b", "main"]));
    assert_eq!(
        map2,
        vec![map[2], map[0]],
        "locations are deduplicated across profiles"
    );
    let s1 = b.add_stack([map[1], map[0]].into_iter()); // main -> a
    let s2 = b.add_stack([map[2], map[0]].into_iter()); // main -> b
    let s3 = b.add_stack([map[1], map[0]].into_iter());
    assert_eq!(s1, s3);
    assert_ne!(s1, s2);
    let t = SymbolTable::decode(&b.encode().unwrap()).unwrap();
    assert_eq!(t.node_count(), 4, "root, main, main>a, main>b");
    assert_eq!(t.stack_count(), 2, "the stacks rows name");
    assert_eq!((s1, s2), (0, 1), "ids numbered as stacks are first met");
    let mut locs = Vec::new();
    t.stack_locations(s2, &mut locs);
    let names: Vec<&str> = locs
        .iter()
        .flat_map(|&l| t.location_function_names(l))
        .collect();
    assert_eq!(names, ["b", "main"]);
}

proptest::proptest! {
    /// Stacks found by their locations get the ids, and build the tree, that walking them
    /// frame by frame does: prefixes of other stacks, the empty stack and repeats included.
    #[test]
    fn stacks_found_by_path_are_the_stacks_walked(
        stacks in proptest::collection::vec(proptest::collection::vec(1u32..5, 0..6), 1..80),
    ) {
        let (mut walked, mut found) = (SymbolsBuilder::default(), SymbolsBuilder::default());
        for stack in &stacks {
            let a = walked.add_stack(stack.iter().copied());
            let b = found.add_stack_path(stack);
            proptest::prop_assert_eq!(a, b);
        }
        proptest::prop_assert_eq!(&walked.parents, &found.parents);
        proptest::prop_assert_eq!(&walked.node_locations, &found.node_locations);
        proptest::prop_assert_eq!(&walked.stacks, &found.stacks);
        let distinct: std::collections::HashSet<&Vec<u32>> = stacks.iter().collect();
        let (lookups, hits) = found.path_lookups();
        proptest::prop_assert_eq!(lookups, stacks.len() as u64);
        proptest::prop_assert_eq!(hits, (stacks.len() - distinct.len()) as u64);
        // Renumbered, the stacks are still found, under their new ids.
        let reversed = (0..walked.stacks.len() as u32).rev();
        proptest::prop_assert_eq!(
            walked.renumber_stacks(reversed.clone()),
            found.renumber_stacks(reversed)
        );
        for stack in &stacks {
            let a = walked.add_stack(stack.iter().copied());
            let b = found.add_stack_path(stack);
            proptest::prop_assert_eq!(a, b);
        }
        proptest::prop_assert_eq!(found.path_lookups().1, hits + stacks.len() as u64);
    }
}

fn sample_builder() -> SymbolsBuilder {
    let mut b = SymbolsBuilder::default();
    let names: Vec<String> = (0..200)
        .map(|i| format!("github.com/acme/service/internal/handler.(*Server).Handle{i}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let map = b.add_locations(&profile_symbols(&names));
    for leaf in 1..map.len() {
        b.add_stack([map[leaf], map[leaf / 2], map[0]].into_iter());
    }
    b
}

#[test]
fn version_1_sections_still_read_as_version_2_does() {
    let v1 = SymbolTable::decode(&sample_builder().encode_v1()).unwrap();
    let v2_bytes = sample_builder().encode().unwrap();
    assert_eq!(&v2_bytes[4..8], &SYMBOLS_VERSION.to_le_bytes());
    let v2 = SymbolTable::decode(&v2_bytes).unwrap();
    assert_eq!(v1.symbols, v2.symbols, "the same table from either format");
    assert!(v2.node_count() > 300, "{}", v2.node_count());
    // Version 1 has no stack ids: an id is a node there.
    assert_eq!(v1.stack_count(), v1.node_count());
    let builder = sample_builder();
    assert_eq!(v2.stack_count(), 199, "one a leaf");
    for id in 0..199 {
        assert_eq!(v2.stack_node(id), Some(builder.stack_node(id)));
        assert_eq!(
            v1.stack_node(builder.stack_node(id)),
            Some(builder.stack_node(id))
        );
    }
    assert_eq!(v2.stack_node(199), None);
    let v1_len = sample_builder().encode_v1().len();
    assert!(
        v2_bytes.len() * 3 < v1_len,
        "names compress: {} vs {v1_len}",
        v2_bytes.len()
    );
}

#[test]
fn the_table_made_while_encoding_is_the_one_decoding_makes() {
    for version in 2..=SYMBOLS_VERSION {
        let (bytes, made) = function_table_builder()
            .encode_version(version, Pages::Kept)
            .unwrap();
        let decoded = SymbolTable::decode(&bytes).unwrap();
        assert_eq!(made.symbols, decoded.symbols, "version {version}");
        assert_eq!(made.stacks, decoded.stacks, "version {version}");
        let (bytes, made) = sample_builder()
            .encode_version(version, Pages::Kept)
            .unwrap();
        let decoded = SymbolTable::decode(&bytes).unwrap();
        assert_eq!(made.symbols, decoded.symbols, "version {version}");
        assert_eq!(made.stacks, decoded.stacks, "version {version}");
        assert!(!made.symbols.functions.is_empty() && made.stack_count() > 0);
    }
}

/// A segment's section (zstd's fast level) and a compacted block's (level 1) are the same
/// format: each decodes to the table its builder made, and only the frames differ.
#[test]
fn segment_and_block_sections_decode_alike() {
    let (segment, made) = sample_builder().encode_with_table(Pages::Segment).unwrap();
    let (block, _) = sample_builder().encode_with_table(Pages::Kept).unwrap();
    assert_eq!(&segment[..8], &block[..8], "magic and version");
    assert_ne!(segment, block, "compressed at another level");
    for bytes in [&segment, &block] {
        let decoded = SymbolTable::decode(bytes).unwrap();
        assert_eq!(decoded.symbols, made.symbols);
        assert_eq!(decoded.stacks, made.stacks);
    }
    // Every compacted level's section is compressed alike (level 1).
    let (fresh, _) = sample_builder().encode_with_table(Pages::Fresh).unwrap();
    assert_eq!(fresh, block);
}

#[test]
fn a_deep_recursive_stack_compresses_past_any_ratio_and_still_reads() {
    let mut b = SymbolsBuilder::default();
    let map = b.add_locations(&profile_symbols(&["recurse"]));
    let deep = b.add_stack(std::iter::repeat_n(map[0], 50_000));
    let bytes = b.encode().unwrap();
    let raw = decoded_len(&bytes[..12], bytes.len() as u64).unwrap();
    assert!(
        raw > 1000 * bytes.len() as u64,
        "{raw} from {}",
        bytes.len()
    );
    let t = SymbolTable::decode(&bytes).unwrap();
    let mut locs = Vec::new();
    t.stack_locations(deep, &mut locs);
    assert_eq!(locs.len(), 50_000);
}

/// Decodes `raw` (a `Symbols` protobuf) sealed as a zstd section of format `version`.
fn decode_as(version: u32, raw: &[u8]) -> Result<SymbolTable, DecodeError> {
    SymbolTable::decode(&sealed_protobuf(version, raw))
}

/// A Go-like function table: files shared by several functions, system names the names
/// but for a few, start lines going up and down (the first ones negative).
fn function_table_builder() -> SymbolsBuilder {
    let mut p = ProfileSymbols::default();
    for i in 0..300u32 {
        let name = format!("github.com/acme/svc/pkg{}.Fn{i}", i % 7);
        p.functions.push(Function {
            system_name: if i % 50 == 7 {
                format!("sys{i}").into()
            } else {
                name.as_str().into()
            },
            name: name.into(),
            filename: format!("/src/pkg{}/file{}.go", i % 7, i % 13).into(),
            start_line: i64::from(i % 40) * 3 - 20,
        });
        p.locations.push(Location {
            lines: kiln_otel::model::smallvec![Line {
                function: i,
                line: 1,
            }],
            ..Default::default()
        });
    }
    let mut b = SymbolsBuilder::default();
    let map = b.add_locations(&p);
    for leaf in 1..map.len() {
        b.add_stack([map[leaf], map[0]].into_iter());
    }
    b
}

/// A profile whose functions share their strings (slices of one buffer, as a decoded pprof
/// body's: one file name for a file's functions, a name that is also the system name) is
/// interned as one whose strings are all apart; an empty file name at the address another
/// file name starts at is a different file.
#[test]
fn shared_and_separate_strings_intern_alike() {
    use kiln_otel::model::SharedStr;
    let mut shared = ProfileSymbols::default();
    let mut apart = ProfileSymbols::default();
    let body = Bytes::from_static(b"/src/main.go");
    let file = SharedStr::try_from(body.clone()).unwrap();
    let empty = SharedStr::try_from(body.slice(0..0)).unwrap();
    assert_eq!(empty.as_ptr(), file.as_ptr());
    for i in 0..20u32 {
        let name = SharedStr::from(format!("main.f{}", i % 15));
        shared.functions.push(Function {
            system_name: name.clone(),
            name,
            filename: if i % 4 == 0 {
                empty.clone()
            } else {
                file.clone()
            },
            start_line: 0,
        });
        let f = &shared.functions[i as usize];
        apart.functions.push(Function {
            name: (*f.name).into(),
            system_name: (*f.system_name).into(),
            filename: (*f.filename).into(),
            start_line: 0,
        });
        for p in [&mut shared, &mut apart] {
            p.locations.push(Location {
                lines: kiln_otel::model::smallvec![Line {
                    function: i,
                    line: 1,
                }],
                ..Default::default()
            });
        }
    }
    let (mut a, mut b) = (SymbolsBuilder::default(), SymbolsBuilder::default());
    assert_eq!(a.add_locations(&shared), b.add_locations(&apart));
    assert_eq!(a.functions, b.functions);
    assert_eq!(a.strings, b.strings);
    // 15 names, a file and the empty string.
    assert_eq!(a.strings.len(), 17);
    // Functions 15..20 repeat 0..5 but for three whose file differs.
    assert_eq!(a.functions.len(), 15 + 3);
}

/// Locations are found by their content's hash: the same content in another profile
/// (other string buffers, other order) finds the same location, and a location differing in
/// any part (mapping, address, frame type, a line's number, its function's name, system
/// name, file or start line) is another; a function no location names is not kept.
#[test]
fn locations_found_by_content_hash_are_the_locations_interned() {
    use kiln_otel::model::Mapping;
    let function = |name: &str, system: &str, file: &str, start: i64| Function {
        name: name.into(),
        system_name: system.into(),
        filename: file.into(),
        start_line: start,
    };
    let profile = |reversed: bool| {
        let mut p = ProfileSymbols {
            functions: vec![
                function("f", "f", "a.go", 1),
                function("f", "f_sys", "a.go", 1),
                function("f", "f", "b.go", 1),
                function("f", "f", "a.go", 2),
                function("g", "g", "a.go", 1),
                function("unused", "unused", "c.go", 0),
            ],
            mappings: vec![Mapping {
                memory_start: 0x1000,
                filename: "/bin/app".into(),
                ..Default::default()
            }],
            locations: Vec::new(),
        };
        let line = |function: u32, line: i64| Line { function, line };
        let location =
            |mapping: Option<u32>, address: u64, lines: Vec<Line>, frame: &str| Location {
                mapping,
                address,
                lines: lines.into_iter().collect(),
                frame_type: frame.into(),
            };
        p.locations = vec![
            location(None, 0, vec![line(0, 10)], ""),
            location(None, 0, vec![line(0, 11)], ""),
            location(None, 0, vec![line(1, 10)], ""),
            location(None, 0, vec![line(2, 10)], ""),
            location(None, 0, vec![line(3, 10)], ""),
            location(None, 0, vec![line(4, 10)], ""),
            location(None, 0, vec![line(4, 10), line(0, 10)], ""),
            location(None, 0, vec![line(0, 10)], "native"),
            location(None, 0x10, vec![line(0, 10)], ""),
            location(Some(0), 0x10, vec![line(0, 10)], ""),
            location(None, 0, vec![line(0, 10)], ""),
        ];
        if reversed {
            p.functions.reverse();
            for l in &mut p.locations {
                for line in &mut l.lines {
                    line.function = 5 - line.function;
                }
            }
            p.locations.reverse();
        }
        p
    };
    let mut b = SymbolsBuilder::default();
    let first = b.add_locations(&profile(false));
    // Ten distinct locations; the last repeats the first.
    assert_eq!(first, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
    assert_eq!(b.locations.len(), 10);
    assert_eq!(b.functions.len(), 5, "the unused function is not kept");
    let mut again = b.add_locations(&profile(true));
    again.reverse();
    assert_eq!(again, first);
    assert_eq!((b.locations.len(), b.functions.len()), (10, 5));
}

#[test]
fn function_columns_read_as_the_messages_did_and_are_smaller() {
    let functions = function_table_builder().functions.clone();
    assert!(functions.iter().any(|f| f.system_name != f.name));
    assert!(functions.iter().any(|f| f.start_line < 0));
    let v3 = function_table_builder()
        .encode_version(3, Pages::Kept)
        .unwrap()
        .0;
    let v4 = function_table_builder().encode().unwrap();
    assert_eq!(&v4[4..8], &4u32.to_le_bytes());
    let (t3, t4) = (
        SymbolTable::decode(&v3).unwrap(),
        SymbolTable::decode(&v4).unwrap(),
    );
    assert_eq!(t4.symbols.functions, functions);
    assert_eq!(t3.symbols, t4.symbols, "the same table from either version");
    assert!(v4.len() < v3.len(), "{} vs {}", v4.len(), v3.len());
}

#[test]
fn bad_function_columns_are_errors() {
    let raw = |functions: Vec<pb::Function>, columns: [Vec<i64>; 4]| {
        let [names, system_names, filenames, start_lines] = columns;
        pb::Symbols {
            strings: vec![String::new(), "main".into()],
            functions,
            locations: vec![pb::Location::default()],
            stack_locations: vec![0],
            stack_parent_distances: vec![0],
            function_name_deltas: names,
            function_system_name_deltas: system_names,
            function_filename_deltas: filenames,
            function_start_line_deltas: start_lines,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let good = raw(
        Vec::new(),
        [vec![1, 0], vec![0, -1], vec![0, 1], vec![5, -7]],
    );
    let t = decode_as(4, &good).unwrap();
    let f = |name, system_name, filename, start_line| pb::Function {
        name,
        system_name,
        filename,
        start_line,
    };
    assert_eq!(t.symbols.functions, [f(1, 1, 0, 5), f(1, 0, 1, -2)]);
    assert!(t.symbols.function_name_deltas.is_empty(), "taken");
    for (columns, what) in [
        (
            [vec![1], vec![], vec![0], vec![0]],
            "function columns of unequal lengths",
        ),
        ([vec![-1], vec![0], vec![0], vec![0]], "function string"),
        ([vec![2], vec![0], vec![0], vec![0]], "function string"),
        (
            [vec![1], vec![i64::MAX], vec![0], vec![0]],
            "function string",
        ),
        (
            [vec![1], vec![0], vec![i64::from(u32::MAX) + 1], vec![0]],
            "function string",
        ),
    ] {
        assert_eq!(
            decode_as(4, &raw(Vec::new(), columns)).unwrap_err(),
            DecodeError::OutOfRange(what)
        );
    }
    assert_eq!(
        decode_as(4, &raw(vec![f(1, 1, 0, 0)], Default::default())).unwrap_err(),
        DecodeError::OutOfRange("functions as messages in format version 4")
    );
    assert_eq!(
        decode_as(3, &good).unwrap_err(),
        DecodeError::OutOfRange("function columns before format version 4")
    );
}

#[test]
fn bad_lengths_and_parent_distances_are_errors() {
    let msg = |distances: Vec<u32>, parents: Vec<u32>| {
        pb::Symbols {
            strings: vec![String::new()],
            locations: vec![pb::Location::default()],
            stack_locations: vec![0; distances.len().max(parents.len())],
            stack_parents: parents,
            stack_parent_distances: distances,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let v2 = |raw: &[u8], claimed: u32| {
        let mut body = claimed.to_le_bytes().to_vec();
        body.extend_from_slice(&zstd::bulk::compress(raw, 1).unwrap());
        SymbolTable::decode(&sealed(2, &[&body]))
    };
    let good = msg(vec![0, 1, 2, 1], vec![]);
    let t = v2(&good, good.len() as u32).unwrap();
    assert_eq!(t.symbols.stack_parents, [0, 0, 0, 2]);
    for claimed in [good.len() as u32 - 1, good.len() as u32 + 1, u32::MAX] {
        assert!(matches!(
            v2(&good, claimed),
            Err(DecodeError::Decompress { .. })
        ));
    }
    let past_root = msg(vec![0, 2], vec![]);
    assert_eq!(
        v2(&past_root, past_root.len() as u32).unwrap_err(),
        DecodeError::StackNodeOrder(1)
    );
    let self_parent = msg(vec![0, 0], vec![]);
    assert_eq!(
        v2(&self_parent, self_parent.len() as u32).unwrap_err(),
        DecodeError::StackNodeOrder(1)
    );
    let both = msg(vec![0, 1], vec![0, 0]);
    assert_eq!(
        v2(&both, both.len() as u32).unwrap_err(),
        DecodeError::StackTreeLength
    );
    assert_eq!(
        SymbolTable::decode(&sealed(2, &[&[1, 2]])).unwrap_err(),
        DecodeError::Truncated("symbols")
    );
    assert!(matches!(
        SymbolTable::decode(&sealed(SYMBOLS_VERSION + 1, &[&good])).unwrap_err(),
        DecodeError::Version { version, .. } if version == SYMBOLS_VERSION + 1
    ));
    // Stack ids: a node of the tree each, and only from version 3 on.
    let with_ids = |deltas: Vec<i64>| {
        pb::Symbols {
            strings: vec![String::new()],
            locations: vec![pb::Location::default()],
            stack_locations: vec![0; 4],
            stack_parent_distances: vec![0, 1, 2, 1],
            stack_node_deltas: deltas,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let t = decode_as(3, &with_ids(vec![3, -2, 1])).unwrap();
    assert_eq!(
        (0..4).map(|i| t.stack_node(i)).collect::<Vec<_>>(),
        [Some(3), Some(1), Some(2), None]
    );
    for bad in [vec![4], vec![1, -2], vec![i64::MAX, 1]] {
        assert_eq!(
            decode_as(3, &with_ids(bad)).unwrap_err(),
            DecodeError::OutOfRange("stack id")
        );
    }
    assert_eq!(
        decode_as(2, &with_ids(vec![1])).unwrap_err(),
        DecodeError::OutOfRange("stack ids before format version 3")
    );
}

proptest::proptest! {
    /// Any function table comes back from format version 4's columns as it went in (the
    /// naive model: the table itself).
    #[test]
    fn function_columns_round_trip(table in proptest::collection::vec((proptest::num::u32::ANY, proptest::num::u32::ANY, proptest::num::u32::ANY, proptest::num::i64::ANY), 0..64)) {
        let functions: Vec<pb::Function> = table
            .into_iter()
            .map(|(name, system_name, filename, start_line)| pb::Function {
                name,
                system_name,
                filename,
                start_line,
            })
            .collect();
        let mut msg = pb::Symbols::default();
        function_columns(&functions, &mut msg);
        proptest::prop_assert_eq!(functions_of_columns(&mut msg).unwrap(), functions);
    }

    /// Whatever follows a valid header and passes the CRC, a decode answers (no panic, no
    /// allocation beyond the ratio cap).
    #[test]
    fn any_sealed_body_decodes_or_errs(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512), version in 1u32..=SYMBOLS_VERSION) {
        let _ = SymbolTable::decode(&sealed(version, &[&body]));
    }
}

#[test]
fn corruption_is_detected() {
    let mut b = SymbolsBuilder::default();
    let map = b.add_locations(&profile_symbols(&["main"]));
    b.add_stack([map[0]].into_iter());
    let mut bytes = b.encode().unwrap().to_vec();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    let err = SymbolTable::decode(&bytes).unwrap_err();
    assert_eq!(err, DecodeError::Checksum("symbols"));
    assert!(err.to_string().contains("checksum"));
    assert!(SymbolTable::decode(b"nope").is_err());
}
