use super::*;

#[test]
fn real_recording_from_env() {
    let Ok(path) = std::env::var("KILN_JFR_FILE") else {
        return;
    };
    let data = std::fs::read(path).unwrap();
    let p = parse(
        &data,
        &LabelsSnapshot::default(),
        None,
        &IngestMeta::default(),
        &NormalizeLimits::default(),
    )
    .unwrap();
    for s in &p.series {
        eprintln!(
            "{} {} samples total {}",
            s.profile_type.id(),
            s.samples.len(),
            s.total()
        );
    }
    for s in p.series[0].samples.iter().take(3) {
        eprintln!("{:?}", p.symbols.frame_names(&s.stack).collect::<Vec<_>>());
    }
}
