//! OTLP/JSON for profiles, mapped by hand onto the `opentelemetry-proto` prost types (the crate's
//! own serde support does not follow OTLP/JSON). Rules: lowerCamelCase keys (snake_case also
//! accepted), 64-bit integers as strings or numbers, trace and span ids as hex (base64 also
//! accepted), other bytes as base64, missing fields as defaults, unknown fields ignored.

use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::profiles::v1development as p;
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::Value;

use crate::ids::hex_decode;
use crate::{Error, Result};

/// Parses an OTLP/JSON `ExportProfilesServiceRequest`.
pub fn parse_request(body: &[u8]) -> Result<ExportProfilesServiceRequest> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| Error::Invalid(format!("invalid JSON: {e}")))?;
    let at = Path(String::new());
    Ok(ExportProfilesServiceRequest {
        resource_profiles: list(&v, "resourceProfiles", &at, resource_profiles)?,
        dictionary: opt(&v, "dictionary", &at, dictionary)?,
    })
}

/// Renders an export response as OTLP/JSON.
pub fn response_json(resp: &ExportProfilesServiceResponse) -> String {
    match &resp.partial_success {
        Some(ExportProfilesPartialSuccess {
            rejected_profiles,
            error_message,
        }) => serde_json::json!({
            "partialSuccess": {
                "rejectedProfiles": rejected_profiles.to_string(),
                "errorMessage": error_message,
            }
        })
        .to_string(),
        None => "{}".to_owned(),
    }
}

#[derive(Clone)]
struct Path(String);

impl Path {
    fn join(&self, key: &str) -> Path {
        Path(if self.0.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.0)
        })
    }
    fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }
    fn err(&self, what: &str) -> Error {
        Error::Invalid(format!(
            "invalid OTLP/JSON at {}: {what}",
            if self.0.is_empty() {
                "the top level"
            } else {
                &self.0
            }
        ))
    }
}

fn snake(camel: &str) -> String {
    let mut s = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            s.push('_');
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    let obj = v.as_object()?;
    obj.get(key)
        .or_else(|| obj.get(&snake(key)))
        .filter(|x| !x.is_null())
}

/// `key`, or `older` (a field's name in an earlier proto) when only that is present.
fn one_of<'k>(v: &Value, key: &'k str, older: &'k str) -> &'k str {
    if field(v, key).is_none() && field(v, older).is_some() {
        older
    } else {
        key
    }
}

fn list<T>(
    v: &Value,
    key: &str,
    at: &Path,
    f: impl Fn(&Value, &Path) -> Result<T>,
) -> Result<Vec<T>> {
    let at = at.join(key);
    match field(v, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, x)| f(x, &at.index(i)))
            .collect(),
        Some(_) => Err(at.err("expected an array")),
    }
}

fn opt<T>(
    v: &Value,
    key: &str,
    at: &Path,
    f: impl Fn(&Value, &Path) -> Result<T>,
) -> Result<Option<T>> {
    field(v, key).map(|x| f(x, &at.join(key))).transpose()
}

fn int_of(v: &Value, at: &Path) -> Result<i128> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i128))
            .ok_or_else(|| at.err("expected an integer")),
        Value::String(s) => s
            .trim()
            .parse::<i128>()
            .map_err(|_| at.err("expected an integer")),
        _ => Err(at.err("expected an integer")),
    }
}

fn num<T: TryFrom<i128>>(v: &Value, key: &str, at: &Path) -> Result<T> {
    let at = at.join(key);
    match field(v, key) {
        None => T::try_from(0).map_err(|_| at.err("out of range")),
        Some(x) => T::try_from(int_of(x, &at)?).map_err(|_| at.err("integer out of range")),
    }
}

fn nums<T: TryFrom<i128>>(v: &Value, key: &str, at: &Path) -> Result<Vec<T>> {
    list(v, key, at, |x, at| {
        T::try_from(int_of(x, at)?).map_err(|_| at.err("integer out of range"))
    })
}

fn string(v: &Value, key: &str, at: &Path) -> Result<String> {
    match field(v, key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(at.join(key).err("expected a string")),
    }
}

/// Trace and span ids: hex per OTLP/JSON, base64 as protojson writes them.
fn id_bytes(v: &Value, key: &str, at: &Path, len: usize) -> Result<Vec<u8>> {
    let s = string(v, key, at)?;
    if s.is_empty() {
        return Ok(Vec::new());
    }
    if s.len() == 2 * len
        && let Some(b) = hex_decode(&s)
    {
        return Ok(b);
    }
    match crate::base64::decode(&s) {
        Some(b) if b.len() == len => Ok(b),
        _ => Err(at.join(key).err(&format!("expected {len} bytes as hex"))),
    }
}

fn bytes_b64(v: &Value, key: &str, at: &Path) -> Result<Vec<u8>> {
    let s = string(v, key, at)?;
    crate::base64::decode(&s).ok_or_else(|| at.join(key).err("expected base64"))
}

fn any_value(v: &Value, at: &Path) -> Result<AnyValue> {
    any_value_at(v, at, 0)
}

/// An attribute value `depth` arrays and key-value lists deep.
fn any_value_at(v: &Value, at: &Path, depth: usize) -> Result<AnyValue> {
    use any_value::Value as V;
    if depth > crate::otlp::MAX_VALUE_DEPTH {
        return Err(at.err(&format!(
            "attribute values nest deeper than {} levels",
            crate::otlp::MAX_VALUE_DEPTH
        )));
    }
    let value = if let Some(x) = field(v, "stringValue") {
        Some(V::StringValue(
            x.as_str()
                .ok_or_else(|| at.err("stringValue must be a string"))?
                .to_owned(),
        ))
    } else if let Some(x) = field(v, "boolValue") {
        Some(V::BoolValue(
            x.as_bool()
                .ok_or_else(|| at.err("boolValue must be a boolean"))?,
        ))
    } else if field(v, "intValue").is_some() {
        Some(V::IntValue(num(v, "intValue", at)?))
    } else if let Some(x) = field(v, "doubleValue") {
        let d = match x {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        Some(V::DoubleValue(
            d.ok_or_else(|| at.err("doubleValue must be a number"))?,
        ))
    } else if let Some(x) = field(v, "arrayValue") {
        Some(V::ArrayValue(ArrayValue {
            values: list(x, "values", &at.join("arrayValue"), |x, at| {
                any_value_at(x, at, depth + 1)
            })?,
        }))
    } else if let Some(x) = field(v, "kvlistValue") {
        Some(V::KvlistValue(KeyValueList {
            values: list(x, "values", &at.join("kvlistValue"), |x, at| {
                key_value_at(x, at, depth + 1)
            })?,
        }))
    } else if field(v, "bytesValue").is_some() {
        Some(V::BytesValue(bytes_b64(v, "bytesValue", at)?))
    } else if field(v, "stringValueStrindex").is_some() {
        Some(V::StringValueStrindex(num(v, "stringValueStrindex", at)?))
    } else {
        None
    };
    Ok(AnyValue { value })
}

fn key_value(v: &Value, at: &Path) -> Result<KeyValue> {
    key_value_at(v, at, 0)
}

fn key_value_at(v: &Value, at: &Path, depth: usize) -> Result<KeyValue> {
    Ok(KeyValue {
        key: string(v, "key", at)?,
        value: opt(v, "value", at, |x, at| any_value_at(x, at, depth))?,
        key_strindex: num(v, "keyStrindex", at)?,
    })
}

fn resource_profiles(v: &Value, at: &Path) -> Result<p::ResourceProfiles> {
    Ok(p::ResourceProfiles {
        resource: opt(v, "resource", at, |x, at| {
            Ok(Resource {
                attributes: list(x, "attributes", at, key_value)?,
                dropped_attributes_count: num(x, "droppedAttributesCount", at)?,
                entity_refs: Vec::new(),
            })
        })?,
        scope_profiles: list(v, "scopeProfiles", at, scope_profiles)?,
        schema_url: string(v, "schemaUrl", at)?,
    })
}

fn scope_profiles(v: &Value, at: &Path) -> Result<p::ScopeProfiles> {
    Ok(p::ScopeProfiles {
        scope: opt(v, "scope", at, |x, at| {
            Ok(InstrumentationScope {
                name: string(x, "name", at)?,
                version: string(x, "version", at)?,
                attributes: list(x, "attributes", at, key_value)?,
                dropped_attributes_count: num(x, "droppedAttributesCount", at)?,
            })
        })?,
        profiles: list(v, "profiles", at, profile)?,
        schema_url: string(v, "schemaUrl", at)?,
    })
}

fn value_type(v: &Value, at: &Path) -> Result<p::ValueType> {
    Ok(p::ValueType {
        type_strindex: num(v, "typeStrindex", at)?,
        unit_strindex: num(v, "unitStrindex", at)?,
    })
}

fn profile(v: &Value, at: &Path) -> Result<p::Profile> {
    let profile_id = {
        let s = string(v, "profileId", at)?;
        if s.is_empty() {
            Vec::new()
        } else {
            hex_decode(&s)
                .filter(|b| b.len() == 16)
                .or_else(|| crate::base64::decode(&s))
                .ok_or_else(|| {
                    at.join("profileId")
                        .err("expected 16 bytes as hex or base64")
                })?
        }
    };
    Ok(p::Profile {
        sample_type: opt(v, "sampleType", at, value_type)?,
        // proto 1.8 named them `sample` (and a location's `line`).
        samples: list(v, one_of(v, "samples", "sample"), at, sample)?,
        time_unix_nano: num(v, "timeUnixNano", at)?,
        duration_nano: num(v, "durationNano", at)?,
        period_type: opt(v, "periodType", at, value_type)?,
        period: num(v, "period", at)?,
        profile_id,
        dropped_attributes_count: num(v, "droppedAttributesCount", at)?,
        original_payload_format: string(v, "originalPayloadFormat", at)?,
        original_payload: bytes_b64(v, "originalPayload", at)?,
        attribute_indices: nums(v, "attributeIndices", at)?,
    })
}

fn sample(v: &Value, at: &Path) -> Result<p::Sample> {
    Ok(p::Sample {
        stack_index: num(v, "stackIndex", at)?,
        attribute_indices: nums(v, "attributeIndices", at)?,
        link_index: num(v, "linkIndex", at)?,
        values: nums(v, "values", at)?,
        timestamps_unix_nano: nums(v, "timestampsUnixNano", at)?,
    })
}

fn dictionary(v: &Value, at: &Path) -> Result<p::ProfilesDictionary> {
    Ok(p::ProfilesDictionary {
        mapping_table: list(v, "mappingTable", at, |x, at| {
            Ok(p::Mapping {
                memory_start: num(x, "memoryStart", at)?,
                memory_limit: num(x, "memoryLimit", at)?,
                file_offset: num(x, "fileOffset", at)?,
                filename_strindex: num(x, "filenameStrindex", at)?,
                attribute_indices: nums(x, "attributeIndices", at)?,
            })
        })?,
        location_table: list(v, "locationTable", at, |x, at| {
            Ok(p::Location {
                mapping_index: num(x, "mappingIndex", at)?,
                address: num(x, "address", at)?,
                lines: list(x, one_of(x, "lines", "line"), at, |l, at| {
                    Ok(p::Line {
                        function_index: num(l, "functionIndex", at)?,
                        line: num(l, "line", at)?,
                        column: num(l, "column", at)?,
                    })
                })?,
                attribute_indices: nums(x, "attributeIndices", at)?,
            })
        })?,
        function_table: list(v, "functionTable", at, |x, at| {
            Ok(p::Function {
                name_strindex: num(x, "nameStrindex", at)?,
                system_name_strindex: num(x, "systemNameStrindex", at)?,
                filename_strindex: num(x, "filenameStrindex", at)?,
                start_line: num(x, "startLine", at)?,
            })
        })?,
        link_table: list(v, "linkTable", at, |x, at| {
            Ok(p::Link {
                trace_id: id_bytes(x, "traceId", at, 16)?,
                span_id: id_bytes(x, "spanId", at, 8)?,
            })
        })?,
        string_table: list(v, "stringTable", at, |x, at| {
            x.as_str()
                .map(str::to_owned)
                .ok_or_else(|| at.err("expected a string"))
        })?,
        attribute_table: list(v, "attributeTable", at, |x, at| {
            Ok(p::KeyValueAndUnit {
                key_strindex: num(x, "keyStrindex", at)?,
                value: opt(x, "value", at, any_value)?,
                unit_strindex: num(x, "unitStrindex", at)?,
            })
        })?,
        stack_table: list(v, "stackTable", at, |x, at| {
            Ok(p::Stack {
                location_indices: nums(x, "locationIndices", at)?,
            })
        })?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_as_strings_or_numbers_ids_as_hex_unknown_fields_ignored() {
        let json = br#"{
            "resourceProfiles": [{"scopeProfiles": [{"profiles": [{
                "sampleType": {"typeStrindex": 1, "unitStrindex": 2},
                "samples": [{"stackIndex": 1, "values": ["806680624", 7], "timestampsUnixNano": ["1774910497581596132", 1774910497581596133], "linkIndex": 1, "futureField": true}],
                "timeUnixNano": "1774910497545532978",
                "profileId": "0102030405060708090a0b0c0d0e0f10"
            }]}]}],
            "dictionary": {
                "stringTable": ["", "cpu", "nanoseconds"],
                "linkTable": [{}, {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174"}],
                "stack_table": [{}, {"locationIndices": [1]}]
            }
        }"#;
        let req = parse_request(json).unwrap();
        let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
        assert_eq!(p.samples[0].values, [806680624, 7]);
        assert_eq!(p.samples[0].timestamps_unix_nano[1], 1774910497581596133);
        assert_eq!(p.time_unix_nano, 1774910497545532978);
        assert_eq!(p.profile_id[15], 0x10);
        let d = req.dictionary.unwrap();
        assert_eq!(
            d.link_table[1].span_id,
            [0xee, 0xe1, 0x9b, 0x7e, 0xc3, 0xc1, 0xb1, 0x74]
        );
        assert_eq!(
            d.stack_table[1].location_indices,
            [1],
            "snake_case keys work too"
        );
    }

    #[test]
    fn errors_say_where() {
        let err = parse_request(br#"{"resourceProfiles": [{"scopeProfiles": [{"profiles": [{"samples": [{"values": ["x"]}]}]}]}]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("resourceProfiles[0].scopeProfiles[0].profiles[0].samples[0].values[0]"),
            "{err}"
        );
        assert!(parse_request(b"{not json").is_err());
    }

    /// Attribute values nested past the limit are refused by the JSON reader (within the
    /// limit they are read), whatever serde_json's own depth allows.
    #[test]
    fn nested_attribute_values_are_bounded() {
        let nested = |levels: usize| {
            let mut v = r#"{"stringValue": "x"}"#.to_owned();
            for i in 0..levels {
                v = if i % 2 == 0 {
                    format!(r#"{{"arrayValue": {{"values": [{v}]}}}}"#)
                } else {
                    format!(r#"{{"kvlistValue": {{"values": [{{"key": "k", "value": {v}}}]}}}}"#)
                };
            }
            format!(
                r#"{{"resourceProfiles": [{{"resource": {{"attributes": [{{"key": "deep", "value": {v}}}]}}}}]}}"#
            )
        };
        let within = crate::otlp::MAX_VALUE_DEPTH;
        assert!(parse_request(nested(within).as_bytes()).is_ok());
        let err = parse_request(nested(within + 1).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nest deeper than 16"), "{err}");
        // serde_json itself stops at 128 levels of JSON.
        assert!(parse_request(nested(60).as_bytes()).is_err());
    }
}
