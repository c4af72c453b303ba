//! `kiln token`: mints and inspects the JSON Web Tokens `--auth jwt` verifies.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::auth::Scope;
use crate::time::parse_duration_secs;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Mint a token: `kiln token create --tenant T --scope read,write --ttl 30d --key FILE`.
    Create(TokenCreate),
    /// Show a token's header and claims (without verifying it).
    Inspect {
        /// The token.
        token: String,
    },
}

#[derive(Debug, Args)]
pub struct TokenCreate {
    /// The tenant the token acts for.
    #[arg(long)]
    pub tenant: String,
    /// More tenants the token may read, comma-separated (the `tenants` claim): a read names
    /// them in `X-Scope-OrgID`, `a|b` for several at once.
    #[arg(long, value_delimiter = ',')]
    pub read_tenants: Vec<String>,
    /// Comma-separated scopes: read, write, admin.
    #[arg(long, default_value = "read,write")]
    pub scope: String,
    /// Lifetime: 30d, 12h, 90s.
    #[arg(long, default_value = "30d")]
    pub ttl: String,
    /// Signing key: an HMAC secret file, or an RSA, ECDSA P-256 or Ed25519 private key (PEM).
    #[arg(long)]
    pub key: PathBuf,
    /// Key id (`kid`); defaults to the key file's name without extension, which is the `kid`
    /// Kiln gives the matching key file in `--jwt-keys`.
    #[arg(long)]
    pub kid: Option<String>,
    /// Issuer claim.
    #[arg(long)]
    pub issuer: Option<String>,
    /// Audience claim.
    #[arg(long)]
    pub audience: Option<String>,
}

/// Runs `kiln token …`, printing to stdout.
pub fn run(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create(c) => {
            let scopes = c
                .scope
                .split(',')
                .map(|s| {
                    Scope::parse(s.trim()).ok_or_else(|| {
                        anyhow::anyhow!("unknown scope {s:?}: use read, write, admin")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let ttl = parse_duration_secs(&c.ttl)
                .ok_or_else(|| anyhow::anyhow!("invalid --ttl {:?}", c.ttl))?;
            let kid = match c.kid {
                Some(k) => k,
                None => c
                    .key
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .ok_or_else(|| anyhow::anyhow!("give --kid"))?
                    .to_owned(),
            };
            let grant = crate::auth::Grant {
                tenant: c.tenant,
                reads: c.read_tenants,
                scopes,
                ttl_secs: ttl,
                issuer: c.issuer,
                audience: c.audience,
            };
            let token = crate::auth::mint_grant(&c.key, &kid, &grant)?;
            println!("{token}");
        }
        TokenCommand::Inspect { token } => {
            println!(
                "{}",
                serde_json::to_string_pretty(&crate::auth::inspect(&token)?)?
            );
        }
    }
    Ok(())
}
