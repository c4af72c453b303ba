//! Untrusted protobuf is checked before prost decodes it: [`check_depth`] walks the wire format
//! without a schema and refuses input that nests deeper than [`MAX_DEPTH`], so no decoder
//! recurses past a bound Kiln chose, whatever prost's own limit is (a dependency can switch
//! prost's off with its `no-recursion-limit` feature: ADR 0012). [`decode`] is the one entry
//! point for request bodies, and [`CheckedCodec`] the gRPC codec of every generated service.
//!
//! Without a schema, a length-delimited field may be a message or bytes. The walk reads each
//! one as a message and, where its content is not valid protobuf, as bytes, so the depth it
//! finds is at least the depth prost would reach: prost recurses only into fields whose content
//! parses. Each byte is read once (an invalid field makes the walk jump to the end of the field
//! it was read as), so the check is linear in the input.

use std::marker::PhantomData;

use bytes::Buf;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};

/// Deepest nesting of messages and groups Kiln decodes. Real requests nest less than 12 deep
/// (an OTLP request's attribute values inside key-value lists inside its dictionary); prost's
/// own limit is 100.
pub const MAX_DEPTH: usize = 32;

/// Why untrusted protobuf was refused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(
        "the protobuf nests messages or groups deeper than {max} levels, which no Kiln API \
         accepts"
    )]
    TooDeep { max: usize },
    #[error(
        "the protobuf would decode to about {estimate} bytes (its fields as a decoder holds \
         them), more than the {max} bytes allowed"
    )]
    TooLarge { estimate: usize, max: usize },
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
}

/// Decodes untrusted protobuf after [`check_depth`] with [`MAX_DEPTH`].
pub fn decode<M: Message + Default, B: Buf + AsRef<[u8]>>(buf: B) -> Result<M, WireError> {
    check_depth(buf.as_ref(), MAX_DEPTH)?;
    Ok(M::decode(buf)?)
}

/// A frame of the walk: a length-delimited field read as a message (it ends at `end`), or a
/// group (it ends at the end group tag of its field number).
#[derive(Debug, Clone, Copy)]
struct Frame {
    end: usize,
    group: Option<u64>,
}

/// Refuses `buf` when it holds messages or groups nested more than `max` deep (the top-level
/// message is depth 0). Input that is not valid protobuf passes when its invalid part is not
/// deep: decoding it is what reports that error.
pub fn check_depth(buf: &[u8], max: usize) -> Result<(), WireError> {
    check_shape(buf, max).map(|_| ())
}

/// Bytes a decoder may allocate per length-delimited field or group, beyond the field's own
/// bytes: a message's struct or a string's and a vector's slot, and the slack of the vector
/// holding it (prost grows vectors by doubling).
pub const FIELD_COST: usize = 32;

/// What decoding `buf` may allocate, estimated without a schema: its bytes, and
/// [`FIELD_COST`] per length-delimited field or group at any depth the walk of [`check_depth`]
/// reaches (an empty message costs a decoder a struct though it is two bytes on the wire; a
/// body of them decodes to many times its size). Refuses what nests deeper than `max`.
pub fn decoded_estimate(buf: &[u8], max: usize) -> Result<usize, WireError> {
    let fields = check_shape(buf, max)?;
    Ok(estimate_of(buf.len(), fields))
}

/// [`decode`], refusing first what [`decoded_estimate`] puts past `max_decoded` bytes.
pub fn decode_within<M: Message + Default, B: Buf + AsRef<[u8]>>(
    buf: B,
    max_decoded: usize,
) -> Result<M, WireError> {
    let estimate = decoded_estimate(buf.as_ref(), MAX_DEPTH)?;
    if estimate > max_decoded {
        return Err(WireError::TooLarge {
            estimate,
            max: max_decoded,
        });
    }
    Ok(M::decode(buf)?)
}

/// Bytes whose shape [`check`] has walked: they nest no deeper than [`MAX_DEPTH`] and decode
/// to about [`Checked::estimate`] bytes. Decoding them ([`Checked::decode`]) does not walk them
/// again: a caller that sizes a request's budget from the estimate reads its bytes twice, not
/// three times.
#[derive(Debug, Clone)]
pub struct Checked {
    bytes: bytes::Bytes,
    estimate: usize,
    /// Length-delimited fields of each number below 16 at the top level, when the walk knew
    /// the schema ([`check_with_schema`]).
    top_level: Option<[usize; 16]>,
}

/// Walks `bytes` as [`decoded_estimate`] does (refusing what nests deeper than [`MAX_DEPTH`])
/// and keeps them with the estimate, to decode later without another walk.
pub fn check(bytes: bytes::Bytes) -> Result<Checked, WireError> {
    let estimate = decoded_estimate(&bytes, MAX_DEPTH)?;
    Ok(Checked {
        bytes,
        estimate,
        top_level: None,
    })
}

impl Checked {
    /// What decoding may allocate ([`decoded_estimate`]).
    pub fn estimate(&self) -> usize {
        self.estimate
    }

    /// How many length-delimited fields (messages and strings) of each number below 16 the
    /// top level holds, as [`check_with_schema`] counted them on its walk (`None` after
    /// [`check`], or where the bytes were not as the schema has them).
    pub fn top_level_counts(&self) -> Option<&[usize; 16]> {
        self.top_level.as_ref()
    }

    /// The bytes walked.
    pub fn bytes(&self) -> &bytes::Bytes {
        &self.bytes
    }

    /// Decodes the walked bytes as `M`.
    pub fn decode<M: Message + Default>(self) -> Result<M, WireError> {
        Ok(M::decode(self.bytes)?)
    }
}

/// A message type as [`check_with_schema`] reads it: which of its fields hold messages, and
/// their types. Every other length-delimited field is a string, bytes or a packed run, which
/// prost copies or reads in place without decoding its content as fields.
#[derive(Debug)]
pub struct Schema {
    /// Field number and type of each field that holds a message.
    pub messages: &'static [(u32, &'static Schema)],
}

impl Schema {
    /// A message none of whose fields holds a message.
    pub const LEAF: Schema = Schema { messages: &[] };

    fn message(&self, number: u64) -> Option<&'static Schema> {
        self.messages
            .iter()
            .find(|&&(n, _)| u64::from(n) == number)
            .map(|&(_, schema)| schema)
    }
}

/// The pprof `Profile` (`google/v1/profile.proto`): its samples (their labels), locations
/// (their lines), mappings, functions and value types are messages; the string table, the
/// samples' location ids and values, and the comments are strings and packed runs.
pub static PPROF_PROFILE: Schema = {
    static SAMPLE: Schema = Schema {
        messages: &[(3, &Schema::LEAF)],
    };
    static LOCATION: Schema = Schema {
        messages: &[(4, &Schema::LEAF)],
    };
    Schema {
        messages: &[
            (1, &Schema::LEAF),
            (2, &SAMPLE),
            (3, &Schema::LEAF),
            (4, &LOCATION),
            (5, &Schema::LEAF),
            (11, &Schema::LEAF),
        ],
    }
};

/// [`check`] for bytes of a known message type: the walk enters only the fields `schema` says
/// hold messages (and groups, which prost's `skip_field` enters), and steps over strings and
/// packed runs without reading them as messages, which [`check`] must try for every
/// length-delimited field. Prost enters no other field, so the depth found bounds the depth
/// prost reaches, and the estimate counts the fields decoding allocates for (the fields of
/// strings' contents that [`check`] may count are not among them).
///
/// Bytes the walk does not find as the schema has them (invalid protobuf, a group still open
/// at the end of its message, nesting past [`MAX_DEPTH`]) are walked by [`check`] instead:
/// its answer, refusal or estimate, stands for them. So this refuses no more than [`check`]
/// does, and its estimate is never above [`check`]'s.
pub fn check_with_schema(bytes: bytes::Bytes, schema: &Schema) -> Result<Checked, WireError> {
    let mut top_level = [0usize; 16];
    let (estimate, top_level) = match walk_schema(&bytes, schema, MAX_DEPTH, &mut top_level) {
        Some(fields) => (estimate_of(bytes.len(), fields), Some(top_level)),
        None => (decoded_estimate(&bytes, MAX_DEPTH)?, None),
    };
    Ok(Checked {
        bytes,
        estimate,
        top_level,
    })
}

/// [`decoded_estimate`] (with [`MAX_DEPTH`]) by the walk of [`check_with_schema`].
pub fn decoded_estimate_with_schema(buf: &[u8], schema: &Schema) -> Result<usize, WireError> {
    let fields = match walk_schema(buf, schema, MAX_DEPTH, &mut [0; 16]) {
        Some(fields) => fields,
        None => check_shape(buf, MAX_DEPTH)?,
    };
    Ok(estimate_of(buf.len(), fields))
}

/// The estimate of a body of `len` bytes holding `fields` length-delimited fields and groups.
fn estimate_of(len: usize, fields: usize) -> usize {
    len.saturating_add(fields.saturating_mul(FIELD_COST))
}

/// The walk of [`check_with_schema`]: the length-delimited fields and groups it read, or `None`
/// where `buf` is not as `schema` has it, or nests deeper than `max`. `top_level`: counts of
/// the top level's length-delimited fields by number (below 16).
fn walk_schema(
    buf: &[u8],
    schema: &Schema,
    max: usize,
    top_level: &mut [usize; 16],
) -> Option<usize> {
    /// A message being read (`group` 0) or a group (its field number; its fields all skipped
    /// by prost, groups among them entered), which ends by `end`.
    #[derive(Clone, Copy)]
    struct Frame<'s> {
        end: usize,
        schema: Option<&'s Schema>,
        group: u64,
    }
    let mut outer: Vec<Frame<'_>> = Vec::new();
    let mut cur = Frame {
        end: buf.len(),
        schema: Some(schema),
        group: 0,
    };
    let (mut pos, mut fields) = (0usize, 0usize);
    loop {
        if pos >= cur.end {
            if cur.group != 0 {
                // Prost would read on past the message's end for the group's end.
                return None;
            }
            match outer.pop() {
                Some(f) => cur = f,
                None => return Some(fields),
            }
            continue;
        }
        let (tag, next) = read_varint(buf, pos, cur.end)?;
        let number = tag >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return None;
        }
        pos = match tag & 7 {
            0 => read_varint(buf, next, cur.end)?.1,
            1 => next.checked_add(8).filter(|&e| e <= cur.end)?,
            5 => next.checked_add(4).filter(|&e| e <= cur.end)?,
            2 => {
                let (len, start) = read_varint(buf, next, cur.end)?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= cur.end - start)?;
                fields += 1;
                if outer.is_empty()
                    && let Some(c) = top_level.get_mut(number as usize)
                {
                    *c += 1;
                }
                match cur.schema.and_then(|s| s.message(number)) {
                    Some(inner) if len > 0 => {
                        if outer.len() >= max {
                            return None;
                        }
                        outer.push(cur);
                        cur = Frame {
                            end: start + len,
                            schema: Some(inner),
                            group: 0,
                        };
                        start
                    }
                    _ => start + len,
                }
            }
            3 => {
                fields += 1;
                if outer.len() >= max {
                    return None;
                }
                outer.push(cur);
                cur = Frame {
                    end: cur.end,
                    schema: None,
                    group: number,
                };
                next
            }
            4 if cur.group == number => {
                cur = outer.pop()?;
                next
            }
            _ => return None,
        };
    }
}

/// The walk of [`check_depth`]; returns the length-delimited fields and groups it read.
fn check_shape(buf: &[u8], max: usize) -> Result<usize, WireError> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut pos = 0usize;
    let mut fields = 0usize;
    loop {
        let end = frames.last().map_or(buf.len(), |f| f.end);
        if pos >= end {
            match frames.last() {
                None => return Ok(fields),
                // A group open at the end of its enclosing message: not a message after all.
                Some(f) if f.group.is_some() => {
                    match unwind_invalid(&mut frames) {
                        Some(next) => pos = next,
                        None => return Ok(fields),
                    }
                    continue;
                }
                Some(_) => {
                    frames.pop();
                    continue;
                }
            }
        }
        match read_field(buf, pos, end) {
            Some((next, Field::Scalar)) => pos = next,
            Some((next, Field::Delimited { len })) => {
                fields += 1;
                if len == 0 {
                    pos = next;
                } else if frames.len() >= max {
                    // One level too deep if prost would enter it: it would when its first
                    // field reads.
                    if read_field(buf, next, next + len).is_some() {
                        return Err(WireError::TooDeep { max });
                    }
                    pos = next + len;
                } else {
                    frames.push(Frame {
                        end: next + len,
                        group: None,
                    });
                    pos = next;
                }
            }
            Some((next, Field::StartGroup { number })) => {
                fields += 1;
                if frames.len() >= max {
                    return Err(WireError::TooDeep { max });
                }
                frames.push(Frame {
                    end,
                    group: Some(number),
                });
                pos = next;
            }
            Some((next, Field::EndGroup { number }))
                if frames.last().and_then(|f| f.group) == Some(number) =>
            {
                frames.pop();
                pos = next;
            }
            Some((_, Field::EndGroup { .. })) | None => match unwind_invalid(&mut frames) {
                Some(next) => pos = next,
                None => return Ok(fields),
            },
        }
    }
}

/// Invalid wire data inside the innermost length-delimited frame: that field is bytes, not a
/// message. Pops it (and the groups open inside it) and returns where its parent goes on; `None`
/// when the invalid data is in the top-level message itself.
fn unwind_invalid(frames: &mut Vec<Frame>) -> Option<usize> {
    while let Some(f) = frames.pop() {
        if f.group.is_none() {
            return Some(f.end);
        }
    }
    None
}

/// One field's wire shape.
enum Field {
    Scalar,
    Delimited { len: usize },
    StartGroup { number: u64 },
    EndGroup { number: u64 },
}

/// Reads the field at `pos` that must end by `end`: where the next field starts and what this
/// one is; `None` when it is not valid protobuf.
fn read_field(buf: &[u8], pos: usize, end: usize) -> Option<(usize, Field)> {
    let (tag, pos) = read_varint(buf, pos, end)?;
    let number = tag >> 3;
    if number == 0 || number > u64::from(u32::MAX >> 3) {
        return None;
    }
    match tag & 7 {
        0 => read_varint(buf, pos, end).map(|(_, next)| (next, Field::Scalar)),
        1 => (end - pos >= 8).then_some((pos + 8, Field::Scalar)),
        5 => (end - pos >= 4).then_some((pos + 4, Field::Scalar)),
        2 => {
            let (len, pos) = read_varint(buf, pos, end)?;
            let len = usize::try_from(len).ok().filter(|&l| l <= end - pos)?;
            Some((pos, Field::Delimited { len }))
        }
        3 => Some((pos, Field::StartGroup { number })),
        4 => Some((pos, Field::EndGroup { number })),
        _ => None,
    }
}

/// A varint of at most 10 bytes at `pos`, before `end`: its value and the position after it.
#[inline]
fn read_varint(buf: &[u8], pos: usize, end: usize) -> Option<(u64, usize)> {
    // Most keys and lengths are one byte.
    match buf.get(pos) {
        Some(&b) if b < 0x80 && pos < end => Some((u64::from(b), pos + 1)),
        _ => read_varint_slow(buf, pos, end),
    }
}

/// [`read_varint`] of a varint of more than one byte (or none).
fn read_varint_slow(buf: &[u8], mut pos: usize, end: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        if pos >= end {
            return None;
        }
        let b = buf[pos];
        pos += 1;
        if shift == 63 && b > 1 {
            return None;
        }
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some((value, pos));
        }
    }
    None
}

/// A field's wire type, as [`fields`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireKind {
    Varint,
    Fixed64,
    Len,
    StartGroup,
    EndGroup,
    Fixed32,
}

/// One field of a message, as [`fields`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireField {
    /// Its field number.
    pub number: u32,
    pub kind: WireKind,
    /// Where its tag starts, and its tag's length in bytes.
    pub tag_at: usize,
    pub tag_len: usize,
    /// Its value's bytes (a length-delimited field's content; a varint's or fixed value's
    /// encoding; empty for group markers).
    pub value: std::ops::Range<usize>,
}

/// The fields of one message, in order, without a schema and without descending into them;
/// stops at the first invalid field (decoding is what reports it). Positions are `buf`'s.
pub fn fields(buf: &[u8]) -> impl Iterator<Item = WireField> + '_ {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let end = buf.len();
        if pos >= end {
            return None;
        }
        let tag_at = pos;
        let (tag, after_tag) = read_varint(buf, pos, end)?;
        let number = u32::try_from(tag >> 3).ok().filter(|&n| n != 0)?;
        let (kind, value) = match tag & 7 {
            0 => {
                let (_, next) = read_varint(buf, after_tag, end)?;
                (WireKind::Varint, after_tag..next)
            }
            1 => (
                WireKind::Fixed64,
                after_tag..after_tag.checked_add(8).filter(|&e| e <= end)?,
            ),
            5 => (
                WireKind::Fixed32,
                after_tag..after_tag.checked_add(4).filter(|&e| e <= end)?,
            ),
            2 => {
                let (len, start) = read_varint(buf, after_tag, end)?;
                let len = usize::try_from(len).ok().filter(|&l| l <= end - start)?;
                (WireKind::Len, start..start + len)
            }
            3 => (WireKind::StartGroup, after_tag..after_tag),
            4 => (WireKind::EndGroup, after_tag..after_tag),
            _ => return None,
        };
        pos = value.end;
        Some(WireField {
            number,
            kind,
            tag_at,
            tag_len: after_tag - tag_at,
            value,
        })
    })
}

/// The gRPC codec of Kiln's generated services: prost, after [`check_depth`]. A message that
/// does not decode is the client's error (`INVALID_ARGUMENT`), not Kiln's.
#[derive(Debug, Clone)]
pub struct CheckedCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for CheckedCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for CheckedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder { _type: PhantomData }
    }
}

/// Decodes `U` after [`check_depth`].
#[derive(Debug, Clone)]
pub struct CheckedDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: Message + Default> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let message = if buf.chunk().len() == buf.remaining() {
            let result = check_depth(buf.chunk(), MAX_DEPTH).map(|()| U::decode(&mut *buf));
            let decoded = match result {
                Ok(Ok(m)) => Ok(m),
                Ok(Err(e)) => Err(WireError::Decode(e)),
                Err(e) => Err(e),
            };
            // A refused message is consumed all the same: the stream reads on from its end.
            buf.advance(buf.remaining());
            decoded
        } else {
            decode(buf.copy_to_bytes(buf.remaining()))
        };
        message
            .map(Some)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests;
