//! Durations and sizes in `kiln serve`'s flags, with their units: `200ms`, `15s`, `1h`
//! (humantime's spelling) and `512MiB`, `1GiB`, `10MB` (bytesize's: `KiB` is 1024 bytes, `KB`
//! 1000). A bare number is in the unit of the flag's old name (`--flush-interval-ms 50`), which
//! is kept as an alias for a release ([`RENAMED`]).

/// Flags renamed when their values took units: (old name, new name). The old names are aliases,
/// and the old environment variables are read when the new ones are not set
/// ([`old_environment`]).
pub const RENAMED: &[(&str, &str)] = &[
    ("remote-write-queue-bytes", "remote-write-queue-size"),
    ("debuginfod-timeout-secs", "debuginfod-timeout"),
    ("debuginfod-missing-ttl-secs", "debuginfod-missing-ttl"),
    ("debuginfod-retry-after-secs", "debuginfod-retry-after"),
    ("debuginfod-max-file-bytes", "debuginfod-max-file-size"),
    ("symbolize-deadline-ms", "symbolize-deadline"),
    ("symbolizer-cache-bytes", "symbolizer-cache-size"),
    ("symbolizer-open-bytes", "symbolizer-open-size"),
    ("symbolizer-resolved-bytes", "symbolizer-resolved-size"),
    (
        "symbolizer-max-inflated-bytes",
        "symbolizer-max-inflated-size",
    ),
    ("header-read-timeout-secs", "header-read-timeout"),
    ("body-read-timeout-secs", "body-read-timeout"),
    ("idle-timeout-secs", "idle-timeout"),
    ("spool-max-bytes", "spool-max-size"),
    ("segment-interval-ms", "segment-interval"),
    ("log-group-linger-ms", "log-group-linger"),
    ("flush-interval-ms", "flush-interval"),
    ("flush-bytes", "flush-size"),
    ("flush-linger-ms", "flush-linger"),
    ("symbols-cache-bytes", "symbols-cache-size"),
    ("results-cache-bytes", "results-cache-size"),
    ("pages-cache-bytes", "pages-cache-size"),
    ("fresh-cache-bytes", "fresh-cache-size"),
    ("allocator-dirty-bytes", "allocator-dirty-size"),
    ("compaction-target-mib", "compaction-target-size"),
    ("upkeep-interval-ms", "upkeep-interval"),
    ("delete-delay-secs", "delete-delay"),
    ("orphan-grace-secs", "orphan-grace"),
    ("orphan-sweep-interval-secs", "orphan-sweep-interval"),
    ("retention-interval-secs", "retention-interval"),
    ("max-body-bytes", "max-body-size"),
    ("max-decompressed-bytes", "max-decompressed-size"),
    ("ingest-rate-bytes", "ingest-rate"),
    ("max-inflight-decode-bytes", "max-inflight-decode-size"),
    ("max-debuginfo-file-bytes", "max-debuginfo-file-size"),
    (
        "max-debuginfo-inflated-bytes",
        "max-debuginfo-inflated-size",
    ),
    ("debuginfo-upload-rate-bytes", "debuginfo-upload-rate"),
    ("parca-stack-cache-bytes", "parca-stack-cache-size"),
    ("self-profile-interval-secs", "self-profile-interval"),
];

/// The environment variable of a flag: `KILN_` and its name in capitals.
pub fn env_name(flag: &str) -> String {
    format!("KILN_{}", flag.to_uppercase().replace('-', "_"))
}

/// The flags to add for old variables (`KILN_FLUSH_INTERVAL_MS` for `--flush-interval`) where
/// neither the new variable nor the flag is given; `environment` reads a variable.
pub fn old_environment(
    argv: &[std::ffi::OsString],
    environment: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    let given = |flag: &str| {
        argv.iter().any(|a| {
            a.to_str().is_some_and(|a| {
                a.strip_prefix("--")
                    .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
            })
        })
    };
    RENAMED
        .iter()
        .filter(|(old, new)| !given(old) && !given(new) && environment(&env_name(new)).is_none())
        .filter_map(|(old, new)| environment(&env_name(old)).map(|v| format!("--{new}={v}")))
        .collect()
}

/// `argv` of `kiln` with the flags of [`old_environment`] added to `kiln serve`'s (the default
/// command when none is named). Other commands' arguments are left as they are.
pub fn with_old_environment(
    mut argv: Vec<std::ffi::OsString>,
    environment: impl Fn(&str) -> Option<String>,
) -> Vec<std::ffi::OsString> {
    let command = argv
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'));
    let serve = match command {
        None => false,
        Some(c) if c == "serve" => true,
        Some(_) => return argv,
    };
    let flags = old_environment(&argv, environment);
    if flags.is_empty() {
        return argv;
    }
    if !serve {
        argv.push("serve".into());
    }
    argv.extend(flags.into_iter().map(Into::into));
    argv
}

fn bare(s: &str) -> Option<u64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (say `200ms`, `15s`, `1h`)"))
}

/// A duration in milliseconds: `200ms`, `2s`, or a bare number of milliseconds.
pub fn millis(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Some(n) = bare(s) {
        return Ok(n);
    }
    let d = duration(s)?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{s:?}: not a whole number of milliseconds"));
    }
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?}: too long"))
}

/// A duration in seconds: `90s`, `10m`, `1h`, or a bare number of seconds.
pub fn secs(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Some(n) = bare(s) {
        return Ok(n);
    }
    let d = duration(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?}: not a whole number of seconds"));
    }
    Ok(d.as_secs())
}

/// A size in bytes: `512MiB`, `1GiB`, `10MB`, or a bare number of bytes. A rate flag reads it
/// as bytes a second.
pub fn bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Some(n) = bare(s) {
        return Ok(n);
    }
    s.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{s:?}: {e} (say `512MiB`, `1GiB`)"))
}

/// A size in bytes, as a `usize`.
pub fn size(s: &str) -> Result<usize, String> {
    usize::try_from(bytes(s)?).map_err(|_| format!("{s:?}: too large"))
}

/// A size in mebibytes: `256MiB`, `1GiB`, or a bare number of MiB.
pub fn mib(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Some(n) = bare(s) {
        return Ok(n);
    }
    let b = bytes(s)?;
    if b % (1 << 20) != 0 {
        return Err(format!("{s:?}: not a whole number of MiB"));
    }
    Ok(b >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_bare_numbers_keep_the_old_unit() {
        assert_eq!(millis("200ms"), Ok(200));
        assert_eq!(millis("2s"), Ok(2000));
        assert_eq!(millis("50"), Ok(50));
        assert!(millis("1500us").is_err());
        assert_eq!(secs("90s"), Ok(90));
        assert_eq!(secs("10m"), Ok(600));
        assert_eq!(secs("1h"), Ok(3600));
        assert_eq!(secs("30"), Ok(30));
        assert!(secs("1500ms").is_err());
        assert!(secs("soon").is_err());
    }

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(bytes("512MiB"), Ok(512 << 20));
        assert_eq!(bytes("1GiB"), Ok(1 << 30));
        assert_eq!(bytes("10MB"), Ok(10_000_000));
        assert_eq!(bytes("4096"), Ok(4096));
        assert!(bytes("lots").is_err());
        assert_eq!(mib("256MiB"), Ok(256));
        assert_eq!(mib("1GiB"), Ok(1024));
        assert_eq!(mib("256"), Ok(256));
        assert!(mib("1000KiB").is_err());
    }

    #[test]
    fn an_old_variable_is_read_only_where_the_new_one_is_not_set() {
        let env = |name: &str| match name {
            "KILN_FLUSH_INTERVAL_MS" => Some("200".to_owned()),
            "KILN_DELETE_DELAY_SECS" => Some("5".to_owned()),
            "KILN_DELETE_DELAY" => Some("10s".to_owned()),
            _ => None,
        };
        let argv = |args: &[&str]| {
            args.iter()
                .map(std::ffi::OsString::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            with_old_environment(argv(&["kiln"]), env),
            argv(&["kiln", "serve", "--flush-interval=200"])
        );
        assert_eq!(
            with_old_environment(argv(&["kiln", "serve", "--shards", "2"]), env),
            argv(&["kiln", "serve", "--shards", "2", "--flush-interval=200"])
        );
        // A flag given on the command line wins, old name or new.
        for given in ["--flush-interval-ms=5", "--flush-interval"] {
            assert_eq!(
                with_old_environment(argv(&["kiln", "serve", given, "5ms"]), env),
                argv(&["kiln", "serve", given, "5ms"])
            );
        }
        // Other commands are left alone.
        assert_eq!(
            with_old_environment(argv(&["kiln", "token", "create"]), env),
            argv(&["kiln", "token", "create"])
        );
    }
}
