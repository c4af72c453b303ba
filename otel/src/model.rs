//! The normalized profile: what the gateway hands to the storage engine.

use std::fmt;

/// Label name of the profile name (the first part of a profile type id).
pub const LABEL_NAME: &str = "__name__";
/// Label name of the service.
pub const LABEL_SERVICE_NAME: &str = "service_name";
/// Label that carries the profile type id in selectors.
pub const LABEL_PROFILE_TYPE: &str = "__profile_type__";
/// Service name used when a profile names none.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// A sorted, de-duplicated label set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels(Vec<(String, String)>);

impl Labels {
    /// Builds a label set; later pairs win over earlier ones with the same name, empty values
    /// are dropped (an empty value means "no such label", as in Prometheus).
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let mut out = Self::default();
        for (k, v) in pairs {
            out.set(k.into(), v.into());
        }
        out
    }

    /// Sets `name` to `value`, replacing an existing value; an empty value removes the label.
    pub fn set(&mut self, name: String, value: String) {
        match self.0.binary_search_by(|(k, _)| k.as_str().cmp(&name)) {
            Ok(i) if value.is_empty() => {
                self.0.remove(i);
            }
            Ok(i) => self.0[i].1 = value,
            Err(_) if value.is_empty() => {}
            Err(i) => self.0.insert(i, (name, value)),
        }
    }

    /// Sets `name` only when it is absent.
    pub fn set_default(&mut self, name: &str, value: &str) {
        if self.get(name).is_none() {
            self.set(name.to_owned(), value.to_owned());
        }
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }

    /// Removes `name`, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<String> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| self.0.remove(i).1)
    }

    /// Pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is no label.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={v:?}")?;
        }
        f.write_str("}")
    }
}

/// A profile type: `name:sample_type:sample_unit:period_type:period_unit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileType {
    pub name: String,
    pub sample_type: String,
    pub sample_unit: String,
    pub period_type: String,
    pub period_unit: String,
}

impl ProfileType {
    /// The id Pyroscope uses on the wire.
    pub fn id(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit
        )
    }

    /// Parses an id with five parts (a sixth, `delta`, is accepted and ignored, as Pyroscope does).
    pub fn parse(id: &str) -> Option<Self> {
        let parts: Vec<&str> = id.split(':').collect();
        if parts.len() != 5 && parts.len() != 6 {
            return None;
        }
        if parts[0].is_empty() || parts[1].is_empty() {
            return None;
        }
        Some(Self {
            name: parts[0].to_owned(),
            sample_type: parts[1].to_owned(),
            sample_unit: parts[2].to_owned(),
            period_type: parts[3].to_owned(),
            period_unit: parts[4].to_owned(),
        })
    }
}

/// A string that shares its bytes: a slice of the request body a pprof string table was
/// decoded from (no copy), or a buffer of its own. Cloning one counts a reference.
pub type SharedStr = bytestring::ByteString;

/// A function, with its strings resolved. The strings are shared: a profile's functions of
/// one file hold one file name, and a name that is also the system name (as most producers
/// send it) is held once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: SharedStr,
    pub system_name: SharedStr,
    pub filename: SharedStr,
    pub start_line: i64,
}

/// An entry of a decoded string table.
pub trait TableString {
    /// The entry as a [`SharedStr`]; `None` when it is not UTF-8.
    fn to_shared(&self) -> Option<SharedStr>;
}

impl TableString for String {
    /// A copy (the table's strings are the decoder's own).
    fn to_shared(&self) -> Option<SharedStr> {
        Some(SharedStr::from(self.as_str()))
    }
}

impl TableString for bytes::Bytes {
    /// A slice of the same buffer, once its bytes are checked to be UTF-8.
    fn to_shared(&self) -> Option<SharedStr> {
        SharedStr::try_from(self.clone()).ok()
    }
}

/// A profile's string table as its functions share it: each string becomes a [`SharedStr`]
/// the first time a function refers to it (checked to be UTF-8 then, once), and every later
/// reference shares that one.
#[derive(Debug)]
pub struct SharedStrings<'a, T> {
    table: &'a [T],
    shared: Vec<Option<SharedStr>>,
}

impl<'a, T: TableString> SharedStrings<'a, T> {
    pub fn new(table: &'a [T]) -> Self {
        Self {
            table,
            shared: vec![None; table.len()],
        }
    }

    /// String `index` of the table, shared; `None` past its end or when it is not UTF-8.
    pub fn get(&mut self, index: usize) -> Option<SharedStr> {
        let slot = self.shared.get_mut(index)?;
        if slot.is_none() {
            *slot = Some(self.table[index].to_shared()?);
        }
        slot.clone()
    }
}

/// A binary mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: String,
    pub build_id: String,
    pub has_functions: bool,
}

/// One line of a location: a function (index into [`Symbols::functions`]) and a line number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: u32,
    pub line: i64,
}

/// A location's lines: one, mostly, held inline (a profile has a location per distinct
/// address, and a vector each was an allocation each).
pub type Lines = smallvec::SmallVec<[Line; 1]>;

/// [`Lines`] of a list, as `vec!` makes a vector.
pub use smallvec::smallvec;

/// A code location. Several lines mean inlined frames, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Location {
    /// Index into [`Symbols::mappings`].
    pub mapping: Option<u32>,
    pub address: u64,
    pub lines: Lines,
    /// The OTLP `profile.frame.type` (native, kernel, jvm, cpython, go, ...); empty when unknown.
    pub frame_type: String,
}

/// The symbol tables a profile's stacks point into.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Symbols {
    pub functions: Vec<Function>,
    pub locations: Vec<Location>,
    pub mappings: Vec<Mapping>,
}

impl Symbols {
    /// Frame names of a stack of location indices, leaf first, inlined frames expanded.
    pub fn frame_names<'a>(&'a self, stack: &'a [u32]) -> impl Iterator<Item = &'a str> + 'a {
        stack.iter().flat_map(move |&loc| {
            let loc = &self.locations[loc as usize];
            loc.lines
                .iter()
                .map(move |line| &*self.functions[line.function as usize].name)
        })
    }
}

/// One stack sample of one series.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// Location indices into [`Symbols::locations`], leaf first.
    pub stack: Vec<u32>,
    pub value: i64,
    /// Span id as Pyroscope reads it (8 bytes, little-endian); 0 means none.
    pub span_id: u64,
    /// Trace id, when the sample carries one.
    pub trace_id: Option<[u8; 16]>,
    /// Sample time in Unix nanoseconds; 0 means the profile's time.
    pub timestamp_nanos: i64,
    /// Labels kept per sample rather than per series (OTLP `thread.id`, `thread.name`,
    /// `cpu.logical_number`), sorted by name.
    pub labels: Vec<(String, String)>,
}

/// One series of a profile: a label set, a profile type and its samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Series {
    /// Series labels, including `__name__` and `service_name`.
    pub labels: Labels,
    pub profile_type: ProfileType,
    /// Profile time in Unix nanoseconds.
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub samples: Vec<Sample>,
}

impl Series {
    /// Sum of the sample values.
    pub fn total(&self) -> i64 {
        self.samples.iter().map(|s| s.value).sum()
    }
}

/// A decoded, validated and normalized profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NormalizedProfile {
    pub symbols: Symbols,
    pub series: Vec<Series>,
}

/// Series labels naming the source a profile was built from (Pyroscope's).
pub const SERVICE_VERSION_LABELS: [&str; 3] =
    ["service_repository", "service_git_ref", "service_root_path"];

impl NormalizedProfile {
    /// Writes the service's source version (`service_repository`, `service_git_ref`,
    /// `service_root_path` of its series) into every mapping's build id, as Pyroscope does at
    /// ingest: a JSON object `{repository, git_ref, build_id, root_path}` (empty fields left
    /// out; `build_id` is the mapping's own), which the Drilldown app's function-details panel
    /// reads back from the merged pprof to link source code. The labels are the request's, so
    /// the first series' are the profile's.
    pub fn inject_service_version(&mut self) {
        let Some(labels) = self.series.first().map(|s| &s.labels) else {
            return;
        };
        let [repository, git_ref, root_path] =
            SERVICE_VERSION_LABELS.map(|name| labels.get(name).unwrap_or_default().to_owned());
        if repository.is_empty() && git_ref.is_empty() && root_path.is_empty() {
            return;
        }
        /// Pyroscope's `ServiceVersion`, its fields in its order.
        #[derive(serde::Serialize)]
        struct Version<'a> {
            #[serde(skip_serializing_if = "str::is_empty")]
            repository: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            git_ref: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            build_id: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            root_path: &'a str,
        }
        for m in &mut self.symbols.mappings {
            let version = Version {
                repository: &repository,
                git_ref: &git_ref,
                build_id: &m.build_id,
                root_path: &root_path,
            };
            if let Ok(json) = serde_json::to_string(&version) {
                m.build_id = json;
            }
        }
    }

    /// Number of samples over all series.
    pub fn sample_count(&self) -> usize {
        self.series.iter().map(|s| s.samples.len()).sum()
    }
}
