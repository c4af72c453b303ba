//! `kiln upload`.

/// `kiln upload` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct UploadArgs {}

pub async fn run(_args: UploadArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
