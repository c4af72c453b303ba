//! go-plugin's start-up contract with Grafana.

/// The magic cookie Grafana sets for datasource plugins.
pub const COOKIE_KEY: &str = "grafana_plugin_type";
pub const COOKIE_VALUE: &str = "datasource";
/// The plugin protocol version Kiln speaks.
pub const PROTOCOL_VERSION: u32 = 2;

/// Why the plugin will not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Grafana's magic cookie is missing: someone ran the binary by hand.
    #[error(
        "this is a Grafana backend plugin, not a program to run by hand: Grafana starts it \
         with {COOKIE_KEY}={COOKIE_VALUE}"
    )]
    NoCookie,
    /// Grafana offers only protocol versions this plugin does not speak.
    #[error("Grafana offers plugin protocol versions {0}; this plugin speaks {PROTOCOL_VERSION}")]
    ProtocolVersions(String),
}

/// Checks the environment Grafana sets; the error says what is wrong.
pub fn check_env(get: impl Fn(&str) -> Option<String>) -> Result<(), HandshakeError> {
    if get(COOKIE_KEY).as_deref() != Some(COOKIE_VALUE) {
        return Err(HandshakeError::NoCookie);
    }
    if let Some(versions) = get("PLUGIN_PROTOCOL_VERSIONS") {
        let ok = versions
            .split(',')
            .any(|v| v.trim().parse::<u32>() == Ok(PROTOCOL_VERSION));
        if !ok {
            return Err(HandshakeError::ProtocolVersions(versions));
        }
    }
    Ok(())
}

/// The line go-plugin reads from stdout: `CORE|APP|NETWORK|ADDR|PROTOCOL`.
pub fn handshake_line(addr: std::net::SocketAddr) -> String {
    format!("1|{PROTOCOL_VERSION}|tcp|{addr}|grpc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_and_versions() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(a, _)| *a == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(check_env(env(&[])).is_err());
        assert!(check_env(env(&[("grafana_plugin_type", "datasource")])).is_ok());
        assert!(
            check_env(env(&[
                ("grafana_plugin_type", "datasource"),
                ("PLUGIN_PROTOCOL_VERSIONS", "1")
            ]))
            .is_err()
        );
        assert!(
            check_env(env(&[
                ("grafana_plugin_type", "datasource"),
                ("PLUGIN_PROTOCOL_VERSIONS", "1,2")
            ]))
            .is_ok()
        );
        assert_eq!(
            handshake_line("127.0.0.1:1234".parse().unwrap()),
            "1|2|tcp|127.0.0.1:1234|grpc"
        );
    }
}
