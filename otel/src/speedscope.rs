//! speedscope JSON (`https://www.speedscope.app/file-format-schema.json`, what py-spy
//! `--format speedscope` writes): sampled and evented profiles, named as Pyroscope names them.
//!
//! - Profiles with the same name, type, unit and start are merged first; each profile left is a
//!   series with a `profile_name` label.
//! - The profile type comes from the application name as for text profiles
//!   ([`text_profile_type`]: `app.cpu`, `app.wall`, no suffix is CPU). When the document holds
//!   more than one profile, the unit is appended to the application name first, as Pyroscope
//!   does: `app.seconds` (any time unit) is wall time, `app.bytes` is memory.
//! - Time units become nanoseconds (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`,
//!   `wall:wall:nanoseconds:cpu:nanoseconds`); unit `none` counts samples at `sampleRate` Hz.
//! - Evented profiles: the time between two events goes to the stack open between them.
//!
//! Where Kiln departs from Pyroscope, it is to keep values right: nanosecond profiles are not
//! zeroed (Pyroscope's rate for them overflows), an evented parent's own time is scaled like its
//! children's, `none` in a document of several profiles counts samples rather than being refused,
//! and a lone `bytes` profile of an application without a type suffix is memory, not CPU.

use serde::Deserialize;

use crate::folded::text_profile_type;
use crate::labels::{AppName, validate_series_labels};
use crate::model::{
    Function, LABEL_NAME, LABEL_SERVICE_NAME, Line, Lines, Location, NormalizedProfile, Series,
    Symbols,
};
use crate::normalize::kernel::{self, SampleKey, SeriesBuilder};
use crate::normalize::{IngestMeta, NormalizeLimits};
use crate::{Error, Result};

/// The `$schema` of a speedscope document.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// Label naming the speedscope profile a series came from.
pub const LABEL_PROFILE_NAME: &str = "profile_name";

/// True when `body` is a JSON object that names the speedscope schema (how `/ingest` without a
/// `format` tells speedscope from folded text).
pub fn looks_like_speedscope(body: &[u8]) -> bool {
    let start = body.iter().position(|b| !b.is_ascii_whitespace());
    start.is_some_and(|i| body[i] == b'{')
        && body.windows(SCHEMA.len()).any(|w| w == SCHEMA.as_bytes())
}

#[derive(Debug, Deserialize)]
struct File {
    #[serde(rename = "$schema")]
    schema: String,
    #[serde(default)]
    shared: Shared,
    #[serde(default)]
    profiles: Vec<Profile>,
}

#[derive(Debug, Default, Deserialize)]
struct Shared {
    #[serde(default)]
    frames: Vec<Frame>,
}

#[derive(Debug, Deserialize)]
struct Frame {
    name: String,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    line: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Profile {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: String,
    unit: String,
    #[serde(default)]
    start_value: f64,
    #[serde(default)]
    events: Vec<Event>,
    #[serde(default)]
    samples: Vec<Vec<f64>>,
    #[serde(default)]
    weights: Vec<f64>,
}

#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    at: f64,
    frame: f64,
}

/// What one unit of a profile's values is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Unit {
    /// Nanoseconds per unit.
    Time(f64),
    /// A sample.
    None,
    Bytes,
}

impl Unit {
    fn parse(unit: &str) -> Result<Self> {
        Ok(match unit {
            "seconds" => Self::Time(1e9),
            "milliseconds" => Self::Time(1e6),
            "microseconds" => Self::Time(1e3),
            "nanoseconds" => Self::Time(1.0),
            "none" => Self::None,
            "bytes" => Self::Bytes,
            other => {
                return Err(Error::Invalid(format!(
                    "speedscope unit {other:?} is not supported (seconds, milliseconds, \
                     microseconds, nanoseconds, none, bytes)"
                )));
            }
        })
    }
}

/// Parses a speedscope document into a normalized profile, one series per profile in it.
pub fn parse(
    body: &[u8],
    name: &AppName,
    sample_rate: u32,
    meta: &IngestMeta,
    limits: &NormalizeLimits,
) -> Result<NormalizedProfile> {
    let file: File = serde_json::from_slice(body)
        .map_err(|e| Error::Invalid(format!("invalid speedscope JSON: {e}")))?;
    if file.schema != SCHEMA {
        return Err(Error::Invalid(format!(
            "unknown speedscope schema {:?}, expected {SCHEMA:?}",
            file.schema
        )));
    }
    let size: usize = file
        .profiles
        .iter()
        .map(|p| p.samples.len() + p.events.len())
        .sum();
    kernel::check_sample_count(size, limits)?;
    let profiles = merge(file.profiles);
    let multi = profiles.len() > 1;

    let mut symbols = Symbols::default();
    // The location of each shared frame, made when a stack first uses it.
    let mut locations: Vec<Option<u32>> = vec![None; file.shared.frames.len()];
    let mut series = Vec::new();
    for profile in &profiles {
        let unit = Unit::parse(&profile.unit)?;
        let app = match (multi, unit) {
            (true, Unit::None) => name.app.clone(),
            (true, _) => format!("{}.{}", name.app, profile.unit),
            (false, Unit::Bytes) if !name.app.contains('.') => format!("{}.bytes", name.app),
            (false, _) => name.app.clone(),
        };
        let rate = match unit {
            Unit::Time(_) => 100,
            Unit::None => sample_rate,
            Unit::Bytes => 0,
        };
        let (service, profile_type, _) = text_profile_type(&app, rate)?;
        let factor = match unit {
            Unit::Time(ns) => ns,
            Unit::None if profile_type.sample_unit == "nanoseconds" => 1e9 / f64::from(sample_rate),
            Unit::None | Unit::Bytes => 1.0,
        };

        let mut labels = meta.labels.clone();
        for (k, v) in name.labels.iter() {
            labels.set(k.to_owned(), v.to_owned());
        }
        if labels.get(LABEL_SERVICE_NAME).is_some() {
            labels.set_default("app_name", &service);
        } else {
            labels.set(LABEL_SERVICE_NAME.into(), service);
        }
        labels.set(LABEL_NAME.into(), profile_type.name.clone());
        labels.set(LABEL_PROFILE_NAME.into(), profile.name.clone());
        validate_series_labels(&labels, &limits.labels)?;

        let mut stacks = Stacks {
            frames: &file.shared.frames,
            locations: &mut locations,
            symbols: &mut symbols,
            builder: SeriesBuilder::new(1),
            stack: Vec::new(),
            factor,
            max_stack_depth: limits.max_stack_depth,
        };
        match profile.kind.as_str() {
            "sampled" => stacks.sampled(profile)?,
            "evented" => stacks.evented(profile)?,
            other => {
                return Err(Error::Invalid(format!(
                    "speedscope profile {:?} has type {other:?}; expected sampled or evented",
                    profile.name
                )));
            }
        }
        let samples = stacks
            .builder
            .finish()
            .into_iter()
            .flat_map(|(_, per_type)| per_type)
            .next()
            .unwrap_or_default();
        if !samples.is_empty() {
            series.push(Series {
                labels,
                profile_type,
                time_nanos: meta.time_nanos,
                duration_nanos: meta.duration_nanos,
                samples,
            });
        }
    }
    Ok(NormalizedProfile { symbols, series })
}

/// Merges profiles with the same name, type, unit and start (Pyroscope does, so that two of
/// them never make one series twice), ordered by their start.
fn merge(profiles: Vec<Profile>) -> Vec<Profile> {
    let mut out: Vec<Profile> = Vec::with_capacity(profiles.len());
    for p in profiles {
        match out.iter_mut().find(|o| {
            o.name == p.name
                && o.kind == p.kind
                && o.unit == p.unit
                && o.start_value.to_bits() == p.start_value.to_bits()
        }) {
            Some(o) => {
                o.samples.extend(p.samples);
                o.weights.extend(p.weights);
                o.events.extend(p.events);
            }
            None => out.push(p),
        }
    }
    out.sort_by(|a, b| a.start_value.total_cmp(&b.start_value));
    out
}

/// One profile's stacks on their way into a series.
struct Stacks<'a> {
    frames: &'a [Frame],
    locations: &'a mut Vec<Option<u32>>,
    symbols: &'a mut Symbols,
    builder: SeriesBuilder<()>,
    stack: Vec<u32>,
    /// Value units per speedscope unit.
    factor: f64,
    max_stack_depth: usize,
}

impl Stacks<'_> {
    fn frame_index(&self, frame: f64) -> Result<usize> {
        let i = frame as usize;
        if frame.fract() != 0.0 || frame < 0.0 || i >= self.frames.len() {
            return Err(Error::Invalid(format!(
                "speedscope frame {frame} is not an index of the {} shared frames",
                self.frames.len()
            )));
        }
        Ok(i)
    }

    fn location(&mut self, frame: usize) -> u32 {
        if let Some(l) = self.locations[frame] {
            return l;
        }
        let f = &self.frames[frame];
        let function = self.symbols.functions.len() as u32;
        self.symbols.functions.push(Function {
            name: f.name.as_str().into(),
            filename: f.file.as_deref().unwrap_or_default().into(),
            ..Default::default()
        });
        let l = self.symbols.locations.len() as u32;
        self.symbols.locations.push(Location {
            lines: Lines::from([Line {
                function,
                line: f.line.filter(|l| l.is_finite()).unwrap_or(0.0) as i64,
            }]),
            ..Default::default()
        });
        self.locations[frame] = Some(l);
        l
    }

    /// Adds `weight` speedscope units to the stack of `frames` (indices, root first).
    fn add(&mut self, frames: &[usize], weight: f64, sample: usize) -> Result<()> {
        let value = weight * self.factor;
        if !value.is_finite() || value < 0.0 || value >= i64::MAX as f64 {
            return Err(Error::Invalid(format!(
                "speedscope sample {sample} has the weight {weight}, not a non-negative number \
                 that fits 64 bits in its unit"
            )));
        }
        let mut stack = std::mem::take(&mut self.stack);
        let Ok(()) = kernel::fill_stack(
            &mut stack,
            frames.iter().rev(),
            self.max_stack_depth,
            |&f| Ok::<_, std::convert::Infallible>(self.location(f)),
        );
        let key = self.builder.hash(SampleKey {
            stack: &stack,
            ..Default::default()
        });
        let result = self.builder.add(0, 0, &key, value.round() as i64, sample);
        self.stack = stack;
        result
    }

    fn sampled(&mut self, profile: &Profile) -> Result<()> {
        if profile.samples.len() != profile.weights.len() {
            return Err(Error::Invalid(format!(
                "speedscope profile {:?} has {} samples and {} weights",
                profile.name,
                profile.samples.len(),
                profile.weights.len()
            )));
        }
        self.builder.series(&());
        let mut frames = Vec::new();
        for (i, (sample, &weight)) in profile.samples.iter().zip(&profile.weights).enumerate() {
            frames.clear();
            for &f in sample {
                frames.push(self.frame_index(f)?);
            }
            self.add(&frames, weight, i)?;
        }
        Ok(())
    }

    fn evented(&mut self, profile: &Profile) -> Result<()> {
        self.builder.series(&());
        let mut open: Vec<usize> = Vec::new();
        let mut last = profile.start_value;
        for (i, event) in profile.events.iter().enumerate() {
            let frame = self.frame_index(event.frame)?;
            if !event.at.is_finite() || event.at < last {
                return Err(Error::Invalid(format!(
                    "speedscope event {i} at {} comes before the one at {last}",
                    event.at
                )));
            }
            if !open.is_empty() {
                let frames = open.clone();
                self.add(&frames, event.at - last, i)?;
            }
            match event.kind.as_str() {
                "O" => open.push(frame),
                "C" => {
                    if open.last() != Some(&frame) {
                        return Err(Error::Invalid(format!(
                            "speedscope event {i} closes frame {frame}, which is not the \
                             innermost open frame"
                        )));
                    }
                    open.pop();
                }
                other => {
                    return Err(Error::Invalid(format!(
                        "speedscope event {i} has type {other:?}; expected \"O\" or \"C\""
                    )));
                }
            }
            last = event.at;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
