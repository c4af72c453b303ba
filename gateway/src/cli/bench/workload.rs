//! The bench's deterministic workload: services × pods, one 10-second CPU profile per pod every
//! step (10 s, or longer for the month preset), pods replaced every `churn` hours when the shape
//! says so (as a Kubernetes deployment replaces them), each profile built from real stacks (the corpus's pprof files, one pool per file; synthetic stacks when the
//! corpus is absent), as pprof bytes for Kiln and as Parquet rows for the peers.
//!
//! The same seed gives the same profiles on every run. Each profile's stacks are distinct (a
//! profile with the same stack twice is merged, as Kiln and Pyroscope do), so Kiln's sample rows
//! and the peers' rows are the same rows.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int64Array, ListBuilder, RecordBatch, StringArray, StringDictionaryBuilder,
    UInt32Array, UInt32Builder,
};
use arrow::datatypes::Int32Type;
use kiln_proto::google::v1 as pprof;
use prost::Message;

/// How long a profile covers (an agent's upload interval), and the step of the presets that
/// profile every pod all the time.
pub const PROFILE_NANOS: i64 = 10_000_000_000;
const HOUR_NANOS: i64 = 3_600_000_000_000;
/// Samples per profile (fewer when a corpus pool holds fewer distinct stacks).
const SAMPLES_PER_PROFILE: usize = 90;
/// The sampling period: 100 Hz.
const PERIOD_NANOS: i64 = 10_000_000;
/// The workload's first profile: 2026-01-01T00:00:00Z, aligned to a six-hour partition.
pub const T0_NANOS: i64 = 1_767_225_600_000_000_000;

/// A workload's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub services: usize,
    /// Pods of a service at any time.
    pub pods: usize,
    pub minutes: i64,
    /// Time between a pod's profiles.
    pub step_nanos: i64,
    /// Pods are replaced (new names, new series) every this many hours; never when `None`.
    pub churn_hours: Option<i64>,
}

impl Shape {
    /// Profiles in the workload.
    pub fn profiles(&self) -> u64 {
        (self.services * self.pods) as u64 * self.steps() as u64
    }

    /// Steps of `step_nanos`.
    pub fn steps(&self) -> i64 {
        self.minutes * 60 * 1_000_000_000 / self.step_nanos
    }

    /// End of the data (exclusive), Unix nanoseconds.
    pub fn end_nanos(&self) -> i64 {
        T0_NANOS + (self.steps() - 1) * self.step_nanos + PROFILE_NANOS
    }

    /// The generation of pods (0, 1, …) alive at `time_nanos`.
    pub fn generation(&self, time_nanos: i64) -> u32 {
        self.churn_hours
            .map_or(0, |h| ((time_nanos - T0_NANOS) / (h * HOUR_NANOS)) as u32)
    }

    /// The `pod` label of pod `pod` of service `service` at `time_nanos`.
    pub fn pod_name(&self, service: usize, pod: usize, time_nanos: i64) -> String {
        match self.churn_hours {
            None => format!("service-{service:02}-pod-{pod}"),
            Some(_) => format!(
                "service-{service:02}-g{:03}-pod-{pod}",
                self.generation(time_nanos)
            ),
        }
    }

    /// Series (service × pod names) with a profile in `[start, end)`, of `services` services.
    pub fn series_in(&self, services: usize, start: i64, end: i64) -> u64 {
        let (start, end) = (start.max(T0_NANOS), end.min(self.end_nanos()));
        if start >= end {
            return 0;
        }
        let generations = u64::from(self.generation(end - 1) - self.generation(start) + 1);
        (services * self.pods) as u64 * generations
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// One profile of the workload.
#[derive(Debug, Clone)]
pub struct Profile {
    pub service: usize,
    pub pod: usize,
    pub time_nanos: i64,
    /// (index into the workload's stack list, value in nanoseconds), stacks distinct.
    pub samples: Vec<(u32, i64)>,
}

/// The generator: stack pools and the stacks seen so far, with their ids.
pub struct Workload {
    pub shape: Shape,
    pools: Vec<Vec<Vec<String>>>,
    /// Root-first stacks by id.
    pub stacks: Vec<Arc<[String]>>,
    ids: HashMap<Arc<[String]>, u32>,
    rng: Rng,
    /// Whether the stacks came from the corpus (false: synthetic).
    pub from_corpus: bool,
}

impl Workload {
    /// A workload of `shape` with stacks from the pprof files in `corpus` (synthetic when it
    /// holds none).
    pub fn new(shape: Shape, corpus: Option<&Path>) -> Self {
        let pools = corpus
            .map(|dir| kiln_otel::pprof::stack_pools(dir, 20))
            .unwrap_or_default();
        let from_corpus = !pools.is_empty();
        let pools = if from_corpus {
            pools
        } else {
            synthetic_pools(shape.services)
        };
        Self {
            shape,
            pools,
            stacks: Vec::new(),
            ids: HashMap::new(),
            rng: Rng(0x5eed),
            from_corpus,
        }
    }

    fn stack_id(&mut self, frames: &[String]) -> u32 {
        if let Some(id) = self.ids.get(frames) {
            return *id;
        }
        let id = self.stacks.len() as u32;
        let key: Arc<[String]> = frames.into();
        self.stacks.push(Arc::clone(&key));
        self.ids.insert(key, id);
        id
    }

    /// The profiles of step `step`, one per pod.
    pub fn step(&mut self, step: i64) -> Vec<Profile> {
        let t = T0_NANOS + step * self.shape.step_nanos;
        let mut out = Vec::with_capacity(self.shape.services * self.shape.pods);
        for service in 0..self.shape.services {
            let pool_index = service % self.pools.len();
            for pod in 0..self.shape.pods {
                let pool_len = self.pools[pool_index].len();
                let start = self.rng.below(pool_len as u64) as usize;
                let mut seen: HashMap<u32, usize> = HashMap::new();
                let mut samples: Vec<(u32, i64)> = Vec::new();
                for k in 0..SAMPLES_PER_PROFILE.min(pool_len) {
                    let frames = self.pools[pool_index][(start + k * 7) % pool_len].clone();
                    let id = self.stack_id(&frames);
                    let value = (1 + self.rng.below(20) as i64) * PERIOD_NANOS;
                    match seen.get(&id) {
                        Some(&i) => samples[i].1 += value,
                        None => {
                            seen.insert(id, samples.len());
                            samples.push((id, value));
                        }
                    }
                }
                out.push(Profile {
                    service,
                    pod,
                    time_nanos: t,
                    samples,
                });
            }
        }
        out
    }

    /// A profile as the pprof bytes an SDK would send (uncompressed): a CPU profile of
    /// nanoseconds sampled at 100 Hz over the 10-second step.
    pub fn pprof(&self, p: &Profile) -> Vec<u8> {
        let mut strings: Vec<String> = vec![String::new(), "cpu".into(), "nanoseconds".into()];
        let mut string_ids: HashMap<&str, i64> = HashMap::new();
        let mut functions: HashMap<&str, u64> = HashMap::new();
        let mut profile = pprof::Profile {
            sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
            period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
            period: PERIOD_NANOS,
            time_nanos: p.time_nanos,
            duration_nanos: PROFILE_NANOS,
            ..Default::default()
        };
        for (stack, value) in &p.samples {
            let frames = &self.stacks[*stack as usize];
            let mut location_id = Vec::with_capacity(frames.len());
            // pprof lists a stack leaf first.
            for name in frames.iter().rev() {
                let next = functions.len() as u64 + 1;
                let id = *functions.entry(name.as_str()).or_insert_with(|| {
                    let s = *string_ids.entry(name.as_str()).or_insert_with(|| {
                        strings.push(name.clone());
                        strings.len() as i64 - 1
                    });
                    profile.function.push(pprof::Function {
                        id: next,
                        name: s,
                        system_name: s,
                        ..Default::default()
                    });
                    profile.location.push(pprof::Location {
                        id: next,
                        line: vec![pprof::Line {
                            function_id: next,
                            line: 0,
                        }],
                        ..Default::default()
                    });
                    next
                });
                location_id.push(id);
            }
            profile.sample.push(pprof::Sample {
                location_id,
                value: vec![*value],
                label: vec![],
            });
        }
        profile.string_table = strings;
        profile.encode_to_vec()
    }

    /// The `/ingest` query of a profile: its series name and labels, and its time range.
    pub fn ingest_query(&self, p: &Profile) -> String {
        let from = p.time_nanos / 1_000_000_000;
        format!(
            "name={}%7Bpod%3D{}%7D&from={from}&until={}&format=pprof&sampleRate=100&spyName=gospy",
            service_name(p.service),
            self.shape.pod_name(p.service, p.pod, p.time_nanos),
            from + PROFILE_NANOS / 1_000_000_000,
        )
    }
}

/// The `service_name` of service `i`.
pub fn service_name(i: usize) -> String {
    format!("service-{i:02}")
}

fn synthetic_pools(services: usize) -> Vec<Vec<Vec<String>>> {
    let mut rng = Rng(7);
    (0..services.max(1))
        .map(|svc| {
            (0..400)
                .map(|_| {
                    let depth = 8 + rng.below(16) as usize;
                    (0..depth)
                        .map(|d| format!("svc{svc}.pkg{}.fn{}", d % 7, rng.below(40)))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Writes the peers' input: `samples.parquet` (service, pod, ts, stack_id, value), and the
/// stacks stored once as a trie: `stacks.parquet` (stack_id, the node ids of its root-first
/// path) and `nodes.parquet` (node_id, parent_id, name).
pub struct PeerRows {
    writer: parquet::arrow::ArrowWriter<std::fs::File>,
    schema: Arc<arrow::datatypes::Schema>,
    pub rows: u64,
}

impl PeerRows {
    /// Starts `dir/samples.parquet`.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        use arrow::datatypes::{DataType, Field, Schema};
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let schema = Arc::new(Schema::new(vec![
            Field::new("service", dict.clone(), false),
            Field::new("pod", dict, false),
            Field::new("ts", DataType::Int64, false),
            Field::new("stack_id", DataType::UInt32, false),
            Field::new("value", DataType::Int64, false),
        ]));
        let file = std::fs::File::create(dir.join("samples.parquet"))?;
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
            .build();
        let writer = parquet::arrow::ArrowWriter::try_new(file, Arc::clone(&schema), Some(props))?;
        Ok(Self {
            writer,
            schema,
            rows: 0,
        })
    }

    /// Appends the rows of `profiles`.
    pub fn add(&mut self, shape: &Shape, profiles: &[Profile]) -> anyhow::Result<()> {
        let mut service = StringDictionaryBuilder::<Int32Type>::new();
        let mut pod = StringDictionaryBuilder::<Int32Type>::new();
        let (mut ts, mut stack, mut value) = (Vec::new(), Vec::new(), Vec::new());
        for p in profiles {
            let (s, pd) = (
                service_name(p.service),
                shape.pod_name(p.service, p.pod, p.time_nanos),
            );
            for (id, v) in &p.samples {
                service.append_value(&s);
                pod.append_value(&pd);
                ts.push(p.time_nanos);
                stack.push(*id);
                value.push(*v);
            }
        }
        self.rows += ts.len() as u64;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(service.finish()),
            Arc::new(pod.finish()),
            Arc::new(Int64Array::from(ts)),
            Arc::new(UInt32Array::from(stack)),
            Arc::new(Int64Array::from(value)),
        ];
        self.writer
            .write(&RecordBatch::try_new(Arc::clone(&self.schema), columns)?)?;
        Ok(())
    }

    /// Finishes the samples file and writes the stack trie of `stacks`.
    pub fn finish(self, dir: &Path, stacks: &[Arc<[String]>]) -> anyhow::Result<()> {
        self.writer.close()?;
        // The trie: node 0 is the root (no frame); a node per distinct root-first prefix.
        let mut children: HashMap<(u32, &str), u32> = HashMap::new();
        let (mut parent, mut name): (Vec<u32>, Vec<&str>) = (vec![0], vec![""]);
        let mut paths = ListBuilder::new(UInt32Builder::new());
        for frames in stacks {
            let mut node = 0u32;
            for f in frames.iter() {
                let next = parent.len() as u32;
                node = *children.entry((node, f.as_str())).or_insert_with(|| {
                    parent.push(node);
                    name.push(f.as_str());
                    next
                });
                paths.values().append_value(node);
            }
            paths.append(true);
        }
        let stack_ids: Vec<u32> = (0..stacks.len() as u32).collect();
        let batch = RecordBatch::try_from_iter(vec![
            (
                "stack_id",
                Arc::new(UInt32Array::from(stack_ids)) as ArrayRef,
            ),
            ("path", Arc::new(paths.finish()) as ArrayRef),
        ])?;
        write_parquet(&dir.join("stacks.parquet"), &batch)?;
        let node_ids: Vec<u32> = (0..parent.len() as u32).collect();
        let batch = RecordBatch::try_from_iter(vec![
            ("node_id", Arc::new(UInt32Array::from(node_ids)) as ArrayRef),
            ("parent_id", Arc::new(UInt32Array::from(parent)) as ArrayRef),
            ("name", Arc::new(StringArray::from(name)) as ArrayRef),
        ])?;
        write_parquet(&dir.join("nodes.parquet"), &batch)
    }
}

fn write_parquet(path: &Path, batch: &RecordBatch) -> anyhow::Result<()> {
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path)?, batch.schema(), None)?;
    w.write(batch)?;
    w.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_profiles() {
        let shape = Shape {
            services: 2,
            pods: 2,
            minutes: 1,
            step_nanos: PROFILE_NANOS,
            churn_hours: None,
        };
        let mut a = Workload::new(shape, None);
        let mut b = Workload::new(shape, None);
        for step in 0..3 {
            let (pa, pb) = (a.step(step), b.step(step));
            assert_eq!(pa.len(), 4);
            for (x, y) in pa.iter().zip(&pb) {
                assert_eq!(a.pprof(x), b.pprof(y));
                let ids: std::collections::HashSet<u32> = x.samples.iter().map(|s| s.0).collect();
                assert_eq!(ids.len(), x.samples.len(), "stacks distinct in a profile");
            }
        }
    }

    #[test]
    fn pprof_decodes_to_the_profile_s_stacks() {
        let shape = Shape {
            services: 1,
            pods: 1,
            minutes: 1,
            step_nanos: PROFILE_NANOS,
            churn_hours: None,
        };
        let mut w = Workload::new(shape, None);
        let p = w.step(0).remove(0);
        let decoded = kiln_otel::pprof::decode(&w.pprof(&p), 64 << 20).unwrap();
        assert_eq!(decoded.sample.len(), p.samples.len());
        let total: i64 = decoded.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, p.samples.iter().map(|s| s.1).sum::<i64>());
    }
}
