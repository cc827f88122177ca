use std::path::PathBuf;

/// What went wrong reading a kernel interface.
///
/// Every variant names the file it came from; parse errors also name the 1-based line and quote it,
/// so a malformed capture or an unexpected kernel format can be found without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason} in {text:?}")]
    Parse { path: PathBuf, line: usize, text: String, reason: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A parse error at `line` (1-based) of `path`, quoting the offending line.
    pub fn parse(path: impl Into<PathBuf>, line: usize, text: &str, reason: impl Into<String>) -> Self {
        // Quoting a whole multi-kilobyte line would drown the reason; the start is enough to find it.
        let text: String = text.chars().take(160).collect();
        Error::Parse { path: path.into(), line, text, reason: reason.into() }
    }
}

/// Read a whole kernel file into a string, naming the file on failure.
pub fn read_to_string(path: impl Into<PathBuf>) -> Result<String> {
    let path = path.into();
    std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })
}
