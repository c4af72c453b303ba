//! The JFR binary format (version 2, JDK 11 and later, and async-profiler), read into generic
//! values.
//!
//! A recording is a sequence of chunks, each self-contained:
//!
//! ```text
//!  chunk header (68 bytes: magic "FLR\0", version, size, offsets of the last constant pool and
//!                of the metadata, start, ticks per second, features)
//!  events: size, type id, then the fields of that type in the order the metadata declares them
//!    type 0: metadata  — a string table and a tree of elements declaring every class and field
//!    type 1: checkpoint — constant pools: per class, (key, value) pairs events refer to by key
//! ```
//!
//! Integers are LEB128 varints (at most nine bytes, the ninth holding eight bits) when the
//! header's features say so, as every JDK since 11 writes them, big-endian otherwise.
//!
//! Everything is bounded: each event is read within its declared size, nesting is limited, and a
//! budget of decoded values proportional to the input stops a small recording from declaring
//! billions of empty values. Malformed input is an [`Error::Jfr`], never a panic.

use crate::Error;
use crate::normalize::kernel::FastMap;

/// Size of a chunk header.
pub const CHUNK_HEADER_SIZE: usize = 68;
/// Deepest nesting of classes within classes, and of metadata elements.
const MAX_DEPTH: usize = 32;

pub type Result<T> = std::result::Result<T, Error>;

fn err(offset: usize, reason: impl Into<String>) -> Error {
    Error::Jfr {
        offset,
        reason: reason.into(),
    }
}

/// A decoded value of a field or constant.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    /// `boolean`, `byte`, `char`, `short`, `int` and `long`.
    Int(i64),
    /// `float` and `double`.
    Float(f64),
    Str(Box<str>),
    /// A constant of the `java.lang.String` pool.
    PoolStr(i64),
    /// A constant of the pool of `class`.
    Ref {
        class: i64,
        key: i64,
    },
    Array(Vec<Value>),
    Object {
        class: i64,
        fields: Vec<Value>,
    },
}

/// How the values of a primitive class are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primitive {
    Boolean,
    Byte,
    Char,
    Short,
    Int,
    Long,
    Float,
    Double,
    String,
}

impl Primitive {
    fn of(name: &str) -> Option<Self> {
        Some(match name {
            "boolean" => Self::Boolean,
            "byte" => Self::Byte,
            "char" => Self::Char,
            "short" => Self::Short,
            "int" => Self::Int,
            "long" => Self::Long,
            "float" => Self::Float,
            "double" => Self::Double,
            "java.lang.String" => Self::String,
            _ => return None,
        })
    }
}

/// A field of a class, as the metadata declares it.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub class: i64,
    /// The value is a key into the pool of `class`.
    pub constant_pool: bool,
    pub array: bool,
}

/// A class the metadata declares.
#[derive(Debug, Clone)]
pub struct Class {
    pub id: i64,
    pub name: String,
    pub fields: Vec<Field>,
    primitive: Option<Primitive>,
}

impl Class {
    /// The index of the field called `name`.
    pub fn field(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }
}

/// The classes of a chunk, by id.
#[derive(Debug, Default)]
pub struct Classes {
    by_id: FastMap<i64, Class>,
    string_class: Option<i64>,
}

impl Classes {
    pub fn get(&self, id: i64) -> Option<&Class> {
        self.by_id.get(&id)
    }

    /// The id of the class called `name`.
    pub fn id_of(&self, name: &str) -> Option<i64> {
        self.by_id.values().find(|c| c.name == name).map(|c| c.id)
    }
}

/// Bytes being read, with the integer encoding of their chunk.
#[derive(Debug, Clone)]
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
    /// Where `data` starts in the recording, for error messages.
    base: usize,
    compressed: bool,
}

impl<'a> Bytes<'a> {
    fn at(&self) -> usize {
        self.base + self.pos
    }

    fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(err(
                self.at(),
                format!("{n} bytes expected, {} left", self.remaining()),
            ));
        }
        let out = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A JFR varint: seven bits a byte, least significant first; the ninth byte holds eight.
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..9 {
            let b = self.u8()?;
            if i == 8 {
                return Ok(v | (u64::from(b) << 56));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                break;
            }
        }
        Ok(v)
    }

    fn long(&mut self) -> Result<i64> {
        if self.compressed {
            Ok(self.varint()? as i64)
        } else {
            Ok(i64::from_be_bytes(self.be()?))
        }
    }

    fn int(&mut self) -> Result<i64> {
        if self.compressed {
            Ok(i64::from(self.varint()? as u32 as i32))
        } else {
            Ok(i64::from(i32::from_be_bytes(self.be()?)))
        }
    }

    fn short(&mut self) -> Result<i64> {
        if self.compressed {
            Ok(i64::from(self.varint()? as u16 as i16))
        } else {
            Ok(i64::from(i16::from_be_bytes(self.be()?)))
        }
    }

    /// A count or length: a non-negative `int` (allocations for it are capped by what is left
    /// to read, and the values it counts by the budget).
    fn count(&mut self, what: &str) -> Result<usize> {
        let at = self.at();
        let n = self.int()?;
        usize::try_from(n).map_err(|_| err(at, format!("negative {what} {n}")))
    }

    fn string(&mut self) -> Result<Value> {
        let at = self.at();
        match self.u8()? {
            0 => Ok(Value::Null),
            1 => Ok(Value::Str("".into())),
            2 => Ok(Value::PoolStr(self.long()?)),
            3 => {
                let n = self.count("string length")?;
                Ok(Value::Str(String::from_utf8_lossy(self.take(n)?).into()))
            }
            4 => {
                let n = self.count("string length")?;
                if n > self.remaining() {
                    return Err(err(
                        at,
                        format!("a string of {n} chars in {} bytes", self.remaining()),
                    ));
                }
                let mut units = Vec::with_capacity(n);
                for _ in 0..n {
                    units.push(self.short()? as u16);
                }
                Ok(Value::Str(String::from_utf16_lossy(&units).into()))
            }
            5 => {
                let n = self.count("string length")?;
                Ok(Value::Str(
                    self.take(n)?
                        .iter()
                        .map(|&b| b as char)
                        .collect::<String>()
                        .into(),
                ))
            }
            e => Err(err(at, format!("unknown string encoding {e}"))),
        }
    }
}

/// The header of a chunk.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub major: u16,
    pub minor: u16,
    pub size: usize,
    pub metadata_offset: usize,
    pub start_nanos: i64,
    pub ticks_per_second: i64,
    pub compressed: bool,
}

fn header(data: &[u8], base: usize) -> Result<Header> {
    if data.len() < CHUNK_HEADER_SIZE {
        return Err(err(
            base,
            format!(
                "a chunk header is {CHUNK_HEADER_SIZE} bytes, {} left",
                data.len()
            ),
        ));
    }
    if &data[..4] != b"FLR\0" {
        return Err(err(base, "not a JFR recording (no \"FLR\" magic)"));
    }
    let mut b = Bytes {
        data,
        pos: 4,
        base,
        compressed: false,
    };
    let major = u16::from_be_bytes(b.be()?);
    let minor = u16::from_be_bytes(b.be()?);
    if major != 2 {
        return Err(err(
            base,
            format!(
                "JFR version {major}.{minor} is not supported (version 2, JDK 11 and later, is)"
            ),
        ));
    }
    let size = b.long()?;
    let _constant_pool_offset = b.long()?;
    let metadata_offset = b.long()?;
    let start_nanos = b.long()?;
    let _duration_nanos = b.long()?;
    let _start_ticks = b.long()?;
    let ticks_per_second = b.long()?;
    let features = u32::from_be_bytes(b.be()?);
    let size = usize::try_from(size)
        .ok()
        .filter(|s| (CHUNK_HEADER_SIZE..=data.len()).contains(s))
        .ok_or_else(|| {
            err(
                base,
                format!(
                    "chunk size {size} is not within the {} bytes left",
                    data.len()
                ),
            )
        })?;
    let metadata_offset = usize::try_from(metadata_offset)
        .ok()
        .filter(|m| (CHUNK_HEADER_SIZE..size).contains(m))
        .ok_or_else(|| {
            err(
                base,
                format!("metadata offset {metadata_offset} is outside the chunk of {size} bytes"),
            )
        })?;
    if ticks_per_second <= 0 {
        return Err(err(base, format!("{ticks_per_second} ticks per second")));
    }
    Ok(Header {
        major,
        minor,
        size,
        metadata_offset,
        start_nanos,
        ticks_per_second,
        compressed: features & 1 == 1,
    })
}

/// A metadata element: a name, attributes and children.
#[derive(Debug, Default)]
struct Element {
    name: String,
    attributes: Vec<(String, String)>,
    children: Vec<Element>,
}

impl Element {
    fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A chunk: its header, classes, constant pools, and where its events are.
#[derive(Debug)]
pub struct Chunk<'a> {
    pub header: Header,
    pub classes: Classes,
    pub pools: FastMap<i64, FastMap<i64, Value>>,
    /// Events of the types asked for, in order: (type id, offset in the chunk).
    pub events: Vec<(i64, usize)>,
    data: &'a [u8],
    base: usize,
}

/// Decodes values within a budget.
pub struct Budget(pub usize);

impl<'a> Chunk<'a> {
    /// Reads the chunk at `base` of `recording`: metadata, every constant pool, and the offsets
    /// of the events whose class names `wanted` accepts.
    pub fn read(
        recording: &'a [u8],
        base: usize,
        wanted: &dyn Fn(&str) -> bool,
        budget: &mut Budget,
    ) -> Result<Self> {
        let header = header(&recording[base..], base)?;
        let data = &recording[base..base + header.size];
        let mut chunk = Chunk {
            header,
            classes: Classes::default(),
            pools: FastMap::default(),
            events: Vec::new(),
            data,
            base,
        };
        chunk.classes = chunk.metadata()?;
        let wanted_ids: Vec<i64> = chunk
            .classes
            .by_id
            .values()
            .filter(|c| wanted(&c.name))
            .map(|c| c.id)
            .collect();
        let mut pos = CHUNK_HEADER_SIZE;
        while pos < data.len() {
            let mut b = chunk.bytes(pos, data.len());
            let size = b.int()?;
            let size = usize::try_from(size)
                .ok()
                .filter(|s| *s > 0 && *s <= data.len() - pos)
                .ok_or_else(|| {
                    err(
                        base + pos,
                        format!(
                            "event size {size} is not within the {} bytes left",
                            data.len() - pos
                        ),
                    )
                })?;
            let ty = b.long()?;
            if ty == 1 {
                chunk.checkpoint(pos, size, budget)?;
            } else if wanted_ids.contains(&ty) {
                chunk.events.push((ty, pos));
            }
            pos += size;
        }
        Ok(chunk)
    }

    /// The chunk's bytes from `from` up to `to` (the end of an event, as its size says; a size
    /// smaller than what it must hold leaves nothing to read, not a panic).
    fn bytes(&self, from: usize, to: usize) -> Bytes<'a> {
        Bytes {
            data: &self.data[..to.min(self.data.len())],
            pos: from,
            base: self.base,
            compressed: self.header.compressed,
        }
    }

    fn metadata(&self) -> Result<Classes> {
        let start = self.header.metadata_offset;
        let mut b = self.bytes(start, self.data.len());
        let size = usize::try_from(b.int()?)
            .ok()
            .filter(|s| *s <= self.data.len() - start)
            .ok_or_else(|| err(self.base + start, "the metadata event overruns its chunk"))?;
        let mut b = self.bytes(b.pos, start + size);
        if b.long()? != 0 {
            return Err(err(
                self.base + start,
                "the metadata offset points at another event",
            ));
        }
        let _start_time = b.long()?;
        let _duration = b.long()?;
        let _id = b.long()?;
        let n = b.count("metadata string count")?;
        if n > b.remaining() {
            return Err(err(
                b.at(),
                format!("{n} metadata strings in {} bytes", b.remaining()),
            ));
        }
        let mut strings = Vec::with_capacity(n);
        for _ in 0..n {
            strings.push(match b.string()? {
                Value::Str(s) => s.into_string(),
                Value::Null => String::new(),
                _ => return Err(err(b.at(), "a metadata string refers to a constant pool")),
            });
        }
        let root = element(&mut b, &strings, 0)?;
        let mut classes = Classes::default();
        for class in root
            .children
            .iter()
            .filter(|e| e.name == "metadata")
            .flat_map(|m| m.children.iter().filter(|e| e.name == "class"))
        {
            let id = number(class, "id")?;
            let name = class.attribute("name").unwrap_or_default().to_owned();
            let mut fields = Vec::new();
            for f in class.children.iter().filter(|e| e.name == "field") {
                fields.push(Field {
                    name: f.attribute("name").unwrap_or_default().to_owned(),
                    class: number(f, "class")?,
                    constant_pool: f.attribute("constantPool") == Some("true"),
                    array: f.attribute("dimension") == Some("1"),
                });
            }
            if name == "java.lang.String" {
                classes.string_class = Some(id);
            }
            classes.by_id.insert(
                id,
                Class {
                    id,
                    primitive: Primitive::of(&name),
                    name,
                    fields,
                },
            );
        }
        // Every field's class must be declared.
        for c in classes.by_id.values() {
            for f in &c.fields {
                if !classes.by_id.contains_key(&f.class) {
                    return Err(err(
                        self.base + start,
                        format!(
                            "field {}.{} is of class {}, which the metadata does not declare",
                            c.name, f.name, f.class
                        ),
                    ));
                }
            }
        }
        Ok(classes)
    }

    fn checkpoint(&mut self, pos: usize, size: usize, budget: &mut Budget) -> Result<()> {
        let mut b = self.bytes(pos, pos + size);
        let _size = b.int()?;
        let _type = b.long()?;
        let _start_time = b.long()?;
        let _duration = b.long()?;
        let _delta = b.long()?;
        let _kind = b.u8()?;
        let pools = b.count("constant pool count")?;
        for _ in 0..pools {
            let at = b.at();
            let class = b.long()?;
            if self.classes.get(class).is_none() {
                return Err(err(
                    at,
                    format!(
                        "a constant pool of class {class}, which the metadata does not declare"
                    ),
                ));
            }
            let n = b.count("constant count")?;
            for _ in 0..n {
                let key = b.long()?;
                let value = decode(&mut b, &self.classes, class, budget, 0)?;
                self.pools.entry(class).or_default().insert(key, value);
            }
        }
        Ok(())
    }

    /// Decodes the event at `pos` (an offset from [`Chunk::events`]).
    pub fn event(&self, pos: usize, budget: &mut Budget) -> Result<Value> {
        let mut b = self.bytes(pos, self.data.len());
        let size = b.int()?;
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| pos.checked_add(s))
            .ok_or_else(|| err(self.base + pos, format!("event size {size}")))?;
        let mut b = self.bytes(b.pos, end);
        let ty = b.long()?;
        decode(&mut b, &self.classes, ty, budget, 0)
    }

    /// Follows a constant pool reference (a value that is none is its own).
    pub fn resolve<'v>(&'v self, v: &'v Value) -> Option<&'v Value> {
        match v {
            Value::Ref { class, key } => self.pools.get(class)?.get(key),
            Value::PoolStr(key) => self.pools.get(&self.classes.string_class?)?.get(key),
            Value::Null => None,
            v => Some(v),
        }
    }

    /// Field `name` of an object (or of the constant a reference names), as written: a
    /// reference stays one.
    pub fn raw_field<'v>(&'v self, v: &'v Value, name: &str) -> Option<&'v Value> {
        let Value::Object { class, fields } = self.resolve(v)? else {
            return None;
        };
        let i = self.classes.get(*class)?.field(name)?;
        fields.get(i)
    }

    /// Field `name` of an object (or of the constant a reference names), resolved.
    pub fn field<'v>(&'v self, v: &'v Value, name: &str) -> Option<&'v Value> {
        self.resolve(self.raw_field(v, name)?)
    }

    /// The text of a string, or of a symbol (`jdk.types.Symbol` and the like: an object whose
    /// first field is its string).
    pub fn text<'v>(&'v self, v: &'v Value) -> Option<&'v str> {
        match self.resolve(v)? {
            Value::Str(s) => Some(s),
            Value::Object { fields, .. } => match self.resolve(fields.first()?)? {
                Value::Str(s) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// An integer value, resolved.
    pub fn int(&self, v: &Value) -> Option<i64> {
        match self.resolve(v)? {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
}

fn number(e: &Element, name: &str) -> Result<i64> {
    let v = e.attribute(name).unwrap_or_default();
    v.parse().map_err(|_| {
        err(
            0,
            format!(
                "metadata element {:?} has {name}={v:?}, not a number",
                e.name
            ),
        )
    })
}

fn element(b: &mut Bytes<'_>, strings: &[String], depth: usize) -> Result<Element> {
    if depth > MAX_DEPTH {
        return Err(err(b.at(), "metadata elements nest too deep"));
    }
    let string = |b: &mut Bytes<'_>| -> Result<String> {
        let at = b.at();
        let i = b.int()?;
        usize::try_from(i)
            .ok()
            .and_then(|i| strings.get(i))
            .cloned()
            .ok_or_else(|| err(at, format!("metadata string {i} of {}", strings.len())))
    };
    let name = string(b)?;
    let n = b.count("attribute count")?;
    let mut attributes = Vec::with_capacity(n.min(b.remaining()));
    for _ in 0..n {
        attributes.push((string(b)?, string(b)?));
    }
    let n = b.count("element count")?;
    let mut children = Vec::with_capacity(n.min(b.remaining()));
    for _ in 0..n {
        children.push(element(b, strings, depth + 1)?);
    }
    Ok(Element {
        name,
        attributes,
        children,
    })
}

fn decode(
    b: &mut Bytes<'_>,
    classes: &Classes,
    class: i64,
    budget: &mut Budget,
    depth: usize,
) -> Result<Value> {
    let at = b.at();
    budget.0 = budget.0.checked_sub(1).ok_or_else(|| {
        err(
            at,
            "the recording declares more values than its size can hold",
        )
    })?;
    let c = classes.get(class).ok_or_else(|| {
        err(
            at,
            format!("a value of class {class}, which the metadata does not declare"),
        )
    })?;
    if let Some(p) = c.primitive {
        return Ok(match p {
            Primitive::Boolean | Primitive::Byte => Value::Int(i64::from(b.u8()? as i8)),
            Primitive::Char | Primitive::Short => Value::Int(b.short()?),
            Primitive::Int => Value::Int(b.int()?),
            Primitive::Long => Value::Int(b.long()?),
            Primitive::Float => Value::Float(f64::from(f32::from_be_bytes(b.be()?))),
            Primitive::Double => Value::Float(f64::from_be_bytes(b.be()?)),
            Primitive::String => b.string()?,
        });
    }
    if depth > MAX_DEPTH {
        return Err(err(at, format!("class {} nests too deep", c.name)));
    }
    let mut fields = Vec::with_capacity(c.fields.len());
    for f in &c.fields {
        let single = |b: &mut Bytes<'_>, budget: &mut Budget| -> Result<Value> {
            if f.constant_pool {
                Ok(Value::Ref {
                    class: f.class,
                    key: b.long()?,
                })
            } else {
                decode(b, classes, f.class, budget, depth + 1)
            }
        };
        if f.array {
            let n = b.count("array length")?;
            let mut items = Vec::with_capacity(n.min(b.remaining()));
            for _ in 0..n {
                items.push(single(b, budget)?);
            }
            fields.push(Value::Array(items));
        } else {
            fields.push(single(b, budget)?);
        }
    }
    Ok(Value::Object { class, fields })
}
