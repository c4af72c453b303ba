//! OTLP profiles bodies in the layouts before proto 1.10, recognised and read.
//!
//! The `v1development` messages were renumbered twice without a new package name, so a body
//! does not say its version; decoded as 1.10 an older body is misread (a 1.9 sample's values
//! become attribute indices) or refused with a confusing error. What changed:
//!
//! | message | 1.8 | 1.9 | 1.10 (what Kiln's types are) |
//! |---|---|---|---|
//! | `Sample` | 2 values, 3 attribute_indices, 4 link_index | as 1.8 | 2 attribute_indices, 3 link_index, 4 values |
//! | `Profile` | 7 comment_strindices, 8 profile_id, 9 dropped_attributes_count, 10 original_payload_format, 11 original_payload, 12 attribute_indices | 7 profile_id … 11 attribute_indices | as 1.9 |
//!
//! Everything else (the dictionary, resources, scopes, stacks, locations, functions, mappings,
//! links) is the same in all three. Senders: OpenTelemetry Collector v0.136–v0.139 write 1.8,
//! v0.140–v0.147 write 1.9, v0.148 and later 1.10.
//!
//! [`to_current`] walks the body without a schema down to profiles and samples (never into the
//! dictionary) and decides from wire types only a layout can have: `Profile` field 8
//! length-delimited or 9 a varint (or any field 12) is 1.8; `Sample` field 3 length-delimited
//! or 4 a varint is 1.8/1.9, field 3 a varint or 4 length-delimited is 1.10; a sample with field
//! 2 but neither 4 (1.10's values) nor 5 (timestamps) is old too, since every layout requires
//! values or timestamps. A body with nothing decisive is 1.10. An older body is then rewritten
//! to 1.10: every field number involved is below 16, so each is one tag byte, changed in place
//! in a copy (no length changes); 1.8's `comment_strindices` becomes field 15, which 1.10 does
//! not have and prost skips. A body that mixes layouts is refused.

use std::borrow::Cow;

use kiln_proto::wire::{WireKind, fields};

use crate::{Error, Result};

#[cfg(test)]
mod tests;

/// The layout of an OTLP profiles protobuf body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// opentelemetry-proto 1.8 (Collector v0.136–v0.139).
    V1_8,
    /// opentelemetry-proto 1.9 (Collector v0.140–v0.147).
    V1_9,
    /// opentelemetry-proto 1.10 and later: what Kiln decodes.
    V1_10,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Self::V1_8 => "1.8",
            Self::V1_9 => "1.9",
            Self::V1_10 => "1.10",
        }
    }
}

/// What the walk saw.
#[derive(Debug, Default)]
struct Evidence {
    profile_1_8: bool,
    profile_1_9_on: bool,
    sample_old: bool,
    sample_1_10: bool,
    /// Where the tags to rewrite are: (position, field number, wire type bits).
    profile_tags: Vec<(usize, u32, u8)>,
    sample_tags: Vec<(usize, u32, u8)>,
}

fn wire_bits(kind: WireKind) -> u8 {
    match kind {
        WireKind::Varint => 0,
        WireKind::Fixed64 => 1,
        WireKind::Len => 2,
        WireKind::StartGroup => 3,
        WireKind::EndGroup => 4,
        WireKind::Fixed32 => 5,
    }
}

/// The fields of `buf[range]` numbered `number` and length-delimited: their contents' ranges in
/// `buf`.
fn children(
    buf: &[u8],
    range: std::ops::Range<usize>,
    number: u32,
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let base = range.start;
    fields(&buf[range])
        .filter(move |f| f.number == number && f.kind == WireKind::Len)
        .map(move |f| base + f.value.start..base + f.value.end)
}

fn walk(body: &[u8]) -> Evidence {
    let mut ev = Evidence::default();
    // Request (or ProfilesData) 1 → ResourceProfiles 2 → ScopeProfiles 2 → Profile.
    for resource in children(body, 0..body.len(), 1) {
        for scope in children(body, resource, 2) {
            for profile in children(body, scope, 2) {
                let base = profile.start;
                for f in fields(&body[profile.clone()]) {
                    let at = base + f.tag_at;
                    if f.tag_len == 1 && (7..=12).contains(&f.number) {
                        ev.profile_tags.push((at, f.number, wire_bits(f.kind)));
                    }
                    match (f.number, f.kind) {
                        (8, WireKind::Len) | (9, WireKind::Varint) | (12, _) => {
                            ev.profile_1_8 = true
                        }
                        (8, WireKind::Varint) | (9, WireKind::Len) => ev.profile_1_9_on = true,
                        (2, WireKind::Len) => {
                            sample(body, base + f.value.start..base + f.value.end, &mut ev)
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    ev
}

fn sample(body: &[u8], range: std::ops::Range<usize>, ev: &mut Evidence) {
    let base = range.start;
    let (mut has2, mut has4, mut has5) = (false, false, false);
    for f in fields(&body[range]) {
        if f.tag_len == 1 && (2..=4).contains(&f.number) {
            ev.sample_tags
                .push((base + f.tag_at, f.number, wire_bits(f.kind)));
        }
        match (f.number, f.kind) {
            (2, _) => has2 = true,
            (3, WireKind::Len) | (4, WireKind::Varint) => ev.sample_old = true,
            (3, WireKind::Varint) | (4, WireKind::Len) => ev.sample_1_10 = true,
            _ => {}
        }
        has4 |= f.number == 4;
        has5 |= f.number == 5;
    }
    if has2 && !has4 && !has5 {
        ev.sample_old = true;
    }
}

/// The body in the 1.10 layout (itself when it is one), and the layout it came in; a body
/// mixing layouts is refused. Malformed protobuf passes through for the decoder to report.
pub fn to_current(body: &[u8]) -> Result<(Layout, Cow<'_, [u8]>)> {
    let ev = walk(body);
    let mixed = |what: &str| {
        Err(Error::Invalid(format!(
            "this OTLP profiles protobuf mixes layouts ({what}); send one version's messages \
             (Kiln reads opentelemetry-proto 1.8, 1.9 and 1.10)"
        )))
    };
    let layout = if ev.profile_1_8 {
        if ev.profile_1_9_on || ev.sample_1_10 {
            return mixed("a 1.8 profile beside 1.9 or 1.10 messages");
        }
        Layout::V1_8
    } else if ev.sample_old {
        if ev.sample_1_10 {
            return mixed("samples of 1.8/1.9 beside samples of 1.10");
        }
        Layout::V1_9
    } else {
        return Ok((Layout::V1_10, Cow::Borrowed(body)));
    };
    let mut out = body.to_vec();
    for &(at, number, wire) in &ev.sample_tags {
        let to = match number {
            2 => 4, // values
            3 => 2, // attribute_indices
            _ => 3, // link_index
        };
        out[at] = ((to << 3) as u8) | wire;
    }
    if layout == Layout::V1_8 {
        for &(at, number, wire) in &ev.profile_tags {
            // comment_strindices (7) has no place in 1.10: field 15, skipped.
            let to = if number == 7 { 15 } else { number - 1 };
            out[at] = ((to << 3) as u8) | wire;
        }
    }
    Ok((layout, Cow::Owned(out)))
}
