//! A series' labels held compactly: the name/value pairs of every series of a metastore entry
//! live in one [`LabelTable`] (each distinct string once, the pairs as string ids), and a
//! series holds a reference to it and its range of pairs, 16 bytes. A tenant of a million
//! series keeps its entries decoded in memory at about a tenth of the cost of owned strings per
//! label (ADR 0017).

use std::sync::Arc;

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

/// Strings and label pairs shared by the series of one entry.
#[derive(Default)]
pub struct LabelTable {
    /// Every string, concatenated; string `i` is `text[ends[i - 1]..ends[i]]`.
    text: String,
    ends: Vec<u32>,
    /// (name id, value id) of every series' labels, series after series.
    pairs: Vec<(u32, u32)>,
}

impl LabelTable {
    /// String `i` of the table.
    pub(crate) fn string(&self, i: u32) -> &str {
        let i = i as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// Distinct strings held.
    pub fn strings(&self) -> usize {
        self.ends.len()
    }

    /// Label pairs held, of every series sharing the table.
    pub(crate) fn pairs(&self) -> usize {
        self.pairs.len()
    }

    /// Approximate bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() + 4 * self.ends.capacity() + 8 * self.pairs.capacity()
    }
}

/// Builds a [`LabelTable`] for many series, each distinct string stored once.
#[derive(Default)]
pub struct LabelTableBuilder {
    table: LabelTable,
    /// Ids of the table's strings by the hash of their text, which the table holds: a copy
    /// per string would cost a million-series entry's decoding tens of megabytes more.
    ids: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// Ranges of the series added, to be tied to the finished table.
    ranges: Vec<(u32, u32)>,
    /// For [`Self::add_labels`]: per table met (kept alive here, so its address stays its
    /// own), the id in this table of each of its strings, `u32::MAX` until met.
    ids_of: hashbrown::HashMap<usize, (Arc<LabelTable>, Vec<u32>)>,
}

/// The id of `s` in `table`, stored on first sight; `ids` holds the table's ids by the hash of
/// their strings.
fn intern(
    table: &mut LabelTable,
    ids: &mut HashTable<u32>,
    hasher: &DefaultHashBuilder,
    s: &str,
) -> u32 {
    let hash = hasher.hash_one(s);
    if let Some(&i) = ids.find(hash, |&i| table.string(i) == s) {
        return i;
    }
    let i = table.ends.len() as u32;
    table.text.push_str(s);
    table.ends.push(table.text.len() as u32);
    let table = &*table;
    ids.insert_unique(hash, i, |&i| hasher.hash_one(table.string(i)));
    i
}

impl LabelTableBuilder {
    /// The id of `s`, stored on first sight.
    pub fn intern(&mut self, s: &str) -> u32 {
        intern(&mut self.table, &mut self.ids, &self.hasher, s)
    }

    /// Adds a series' labels; returns its number among the series added.
    pub fn add<'a>(&mut self, labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> usize {
        let start = self.table.pairs.len() as u32;
        for (k, v) in labels {
            let pair = (self.intern(k), self.intern(v));
            self.table.pairs.push(pair);
        }
        self.ranges
            .push((start, self.table.pairs.len() as u32 - start));
        self.ranges.len() - 1
    }

    /// Adds a series' labels given as another table's: each string of that table is looked up
    /// once, not once per series naming it (a merge's output gathers its series from a few
    /// tables, each naming a string such as `service_name` a million times).
    pub fn add_labels(&mut self, labels: &SeriesLabels) -> usize {
        let start = self.table.pairs.len() as u32;
        let source = labels.table();
        let (_, map) = self
            .ids_of
            .entry(Arc::as_ptr(source) as usize)
            .or_insert_with(|| (Arc::clone(source), vec![u32::MAX; source.strings()]));
        for &(k, v) in labels.ids() {
            let mut id = |i: u32| {
                let slot = &mut map[i as usize];
                if *slot == u32::MAX {
                    *slot = intern(
                        &mut self.table,
                        &mut self.ids,
                        &self.hasher,
                        source.string(i),
                    );
                }
                *slot
            };
            let pair = (id(k), id(v));
            self.table.pairs.push(pair);
        }
        self.ranges
            .push((start, self.table.pairs.len() as u32 - start));
        self.ranges.len() - 1
    }

    /// The labels of every series added, in order.
    pub fn finish(mut self) -> Vec<SeriesLabels> {
        self.table.text.shrink_to_fit();
        self.table.ends.shrink_to_fit();
        self.table.pairs.shrink_to_fit();
        let table = Arc::new(self.table);
        self.ranges
            .into_iter()
            .map(|(start, len)| SeriesLabels {
                table: Arc::clone(&table),
                start,
                len,
            })
            .collect()
    }
}

/// One series' labels, sorted by name as they were given.
#[derive(Clone)]
pub struct SeriesLabels {
    table: Arc<LabelTable>,
    start: u32,
    len: u32,
}

impl SeriesLabels {
    /// Labels of one series (a table of its own).
    pub fn new<K: AsRef<str>, V: AsRef<str>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        let pairs: Vec<(K, V)> = pairs.into_iter().collect();
        let mut b = LabelTableBuilder::default();
        b.add(pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())));
        b.finish().pop().expect("one series added")
    }

    /// The (name, value) pairs.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + Clone + '_ {
        self.table.pairs[self.start as usize..(self.start + self.len) as usize]
            .iter()
            .map(|&(k, v)| (self.table.string(k), self.table.string(v)))
    }

    /// The value of label `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pairs as owned strings.
    pub fn to_vec(&self) -> Vec<(String, String)> {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The table these labels live in (shared by an entry's series).
    pub fn table(&self) -> &Arc<LabelTable> {
        &self.table
    }

    /// The (name, value) pairs as ids of strings of [`Self::table`].
    pub(crate) fn ids(&self) -> &[(u32, u32)] {
        &self.table.pairs[self.start as usize..(self.start + self.len) as usize]
    }
}

impl Default for SeriesLabels {
    fn default() -> Self {
        Self::new(std::iter::empty::<(&str, &str)>())
    }
}

impl PartialEq for SeriesLabels {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for SeriesLabels {}

impl PartialOrd for SeriesLabels {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SeriesLabels {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.iter().cmp(other.iter())
    }
}

impl std::hash::Hash for SeriesLabels {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        for (k, v) in self.iter() {
            k.hash(state);
            v.hash(state);
        }
    }
}

impl std::fmt::Debug for SeriesLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for SeriesLabels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self::new(iter)
    }
}

/// One series of a dataset: its labels (with `__name__` and `service_name`), profile type id,
/// time range and rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesMeta {
    /// Sorted by name; shared with the entry's other series ([`SeriesLabels`]).
    pub labels: SeriesLabels,
    pub profile_type: Arc<str>,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    /// The series' rows are `first_row..first_row + rows` of the samples section.
    pub first_row: u64,
    pub rows: u64,
}

impl SeriesMeta {
    /// The value of a label.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name)
    }

    /// Whether the series has samples in `[start, end)`.
    pub fn overlaps(&self, start_nanos: i64, end_nanos: i64) -> bool {
        self.min_time_nanos < end_nanos && self.max_time_nanos >= start_nanos
    }

    /// The row range.
    pub fn row_range(&self) -> std::ops::Range<u64> {
        self.first_row..self.first_row + self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_share_one_table_and_read_back_their_own_labels() {
        let mut b = LabelTableBuilder::default();
        b.add([("service_name", "a"), ("pod", "1")]);
        b.add([]);
        b.add([("service_name", "a"), ("pod", "2")]);
        let s = b.finish();
        assert_eq!(
            s[0].to_vec(),
            [
                ("service_name".into(), "a".into()),
                ("pod".into(), "1".into())
            ]
        );
        assert!(s[1].is_empty());
        assert_eq!(s[2].get("pod"), Some("2"));
        assert_eq!(s[2].get("nope"), None);
        assert!(Arc::ptr_eq(s[0].table(), s[2].table()));
        // "service_name", "a", "pod", "1", "2": each once.
        assert_eq!(s[0].table().ends.len(), 5);
        assert_eq!(
            s[0],
            SeriesLabels::new([("service_name", "a"), ("pod", "1")])
        );
        assert!(s[0] < s[2]);
        // Labels given as other tables' land in one table, each string once.
        let other = SeriesLabels::new([("pod", "3"), ("service_name", "a")]);
        let mut b = LabelTableBuilder::default();
        for l in [&s[0], &other, &s[2], &s[1]] {
            b.add_labels(l);
        }
        let merged = b.finish();
        assert_eq!(merged[0], s[0]);
        assert_eq!(merged[1], other);
        assert_eq!(merged[2], s[2]);
        assert!(merged[3].is_empty());
        assert!(Arc::ptr_eq(merged[0].table(), merged[1].table()));
        // "service_name", "a", "pod", "1", "3", "2".
        assert_eq!(merged[0].table().strings(), 6);
        assert_eq!(
            format!("{:?}", s[2]),
            r#"[("service_name", "a"), ("pod", "2")]"#
        );
    }
}
