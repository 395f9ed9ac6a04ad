//! What the Envoy configuration's files look like on disk, so a reload (`control`) can tell
//! whether they changed since they were read.

/// What the Envoy configuration's files look like: name, modification time and length of the
/// file, or of each `*.yaml`/`*.yml` file of the directory (what `envoy::load` reads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp(Vec<(std::path::PathBuf, Option<std::time::SystemTime>, u64)>);

/// The [`Stamp`] of `path` now.
pub(crate) fn stamp(path: &std::path::Path) -> Stamp {
    let one = |p: &std::path::Path| {
        let m = std::fs::metadata(p).ok();
        (
            p.to_path_buf(),
            m.as_ref().and_then(|m| m.modified().ok()),
            m.map_or(0, |m| m.len()),
        )
    };
    if !path.is_dir() {
        return Stamp(vec![one(path)]);
    }
    let mut v: Vec<_> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .map(|p| one(&p))
        .collect();
    v.sort();
    Stamp(v)
}
