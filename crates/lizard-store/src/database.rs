//! Which engine holds the state: the `--database` setting, read once at start.
//!
//! Absent: SQLite in the data directory (`<data_dir>/lizard.db`, the embedded default);
//! `sqlite:///path/lizard.db`: that SQLite file; `postgres://…` or `postgresql://…`: a
//! PostgreSQL server shared by every replica. A URL may carry a password: it is only ever
//! shown through [`redact`] (`postgres://lizard:***@db/lizard`).

use std::path::PathBuf;

/// Why a `--database` value was refused. Never quotes the value (it may hold a password).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DatabaseUrlError {
    #[error(
        "unsupported database URL scheme {0:?}: use sqlite:///path/lizard.db or postgres://user@host:port/database"
    )]
    UnknownScheme(String),
    #[error("a database URL starts with its scheme: sqlite:///path/lizard.db or postgres://user@host:port/database")]
    NoScheme,
    #[error("a sqlite database URL names an absolute file path: sqlite:///path/lizard.db")]
    NoSqlitePath,
}

/// A `--database` value as given: a URL that may hold a password. Its `Debug` and
/// `Display` show it redacted, so a config printed whole leaks nothing; only
/// [`DatabaseUrl::expose`] gives the password (to the driver).
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn new(url: impl Into<String>) -> Self {
        DatabaseUrl(url.into())
    }

    /// The URL with its password: for opening the store, never for showing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DatabaseUrl").field(&redact(&self.0)).finish()
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// `<data_dir>/lizard.db`.
    DataDir,
    /// A SQLite file elsewhere.
    SqliteFile(PathBuf),
    /// A PostgreSQL server; the URL as given (password included: use [`redact`] to show it).
    Postgres(String),
}

impl Database {
    /// Read a `--database` value (`None`: the default).
    pub fn parse(url: Option<&str>) -> Result<Self, DatabaseUrlError> {
        let Some(url) = url.map(str::trim).filter(|u| !u.is_empty()) else { return Ok(Database::DataDir) };
        let Some((scheme, rest)) = url.split_once(':') else { return Err(DatabaseUrlError::NoScheme) };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(Database::Postgres(url.to_string())),
            "sqlite" => {
                // sqlite:///abs/path (empty authority) or sqlite:/abs/path.
                let path = rest.strip_prefix("//").unwrap_or(rest);
                let path = path.split(['?', '#']).next().unwrap_or_default();
                if !path.starts_with('/') || path.len() < 2 {
                    return Err(DatabaseUrlError::NoSqlitePath);
                }
                Ok(Database::SqliteFile(PathBuf::from(path)))
            }
            other => Err(DatabaseUrlError::UnknownScheme(other.chars().take(32).collect())),
        }
    }
}

/// The password of a URL's `user:password@` part, if any (as written in the URL).
fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then_some(password)
}

/// `url` with its password replaced by `***`: the form logs and errors show.
pub fn redact(url: &str) -> String {
    match password(url) {
        Some(p) => url.replacen(&format!(":{p}@"), ":***@", 1),
        None => url.to_string(),
    }
}

/// `message` with every occurrence of `url`'s password replaced by `***` (a driver's
/// error text may quote the URL it was given).
pub fn scrub(url: &str, message: &str) -> String {
    let mut out = message.replace(url, &redact(url));
    if let Some(p) = password(url) {
        out = out.replace(p, "***");
        if let Ok(decoded) = urlencoding::decode(p) {
            if !decoded.is_empty() {
                out = out.replace(decoded.as_ref(), "***");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_are_chosen_by_scheme() {
        assert_eq!(Database::parse(None), Ok(Database::DataDir));
        assert_eq!(Database::parse(Some("  ")), Ok(Database::DataDir));
        assert_eq!(Database::parse(Some("sqlite:///var/lib/l.db")), Ok(Database::SqliteFile("/var/lib/l.db".into())));
        assert_eq!(Database::parse(Some("sqlite:/var/lib/l.db")), Ok(Database::SqliteFile("/var/lib/l.db".into())));
        assert_eq!(Database::parse(Some("sqlite://relative.db")), Err(DatabaseUrlError::NoSqlitePath));
        assert_eq!(Database::parse(Some("sqlite:///")), Err(DatabaseUrlError::NoSqlitePath));
        for url in ["postgres://lizard@db/lizard", "postgresql://u:p@db:5432/x", "POSTGRES://db/x"] {
            assert_eq!(Database::parse(Some(url)), Ok(Database::Postgres(url.into())));
        }
        assert_eq!(Database::parse(Some("mysql://u:secret@h/d")), Err(DatabaseUrlError::UnknownScheme("mysql".into())));
        assert_eq!(Database::parse(Some("lizard.db")), Err(DatabaseUrlError::NoScheme));
    }

    #[test]
    fn passwords_never_show() {
        let url = "postgres://lizard:s3cr%40t@db:5432/lizard?sslmode=disable";
        assert_eq!(redact(url), "postgres://lizard:***@db:5432/lizard?sslmode=disable");
        assert_eq!(redact("postgres://lizard@db/lizard"), "postgres://lizard@db/lizard");
        assert_eq!(redact("postgres://db/lizard"), "postgres://db/lizard");
        let said = scrub(url, &format!("cannot connect to {url}: password s3cr@t refused (s3cr%40t)"));
        assert!(!said.contains("s3cr"), "{said}");
        assert!(said.contains("postgres://lizard:***@db:5432/lizard"), "{said}");
        let configured = DatabaseUrl::new(url);
        for shown in [format!("{configured}"), format!("{configured:?}")] {
            assert!(!shown.contains("s3cr") && shown.contains("***"), "{shown}");
        }
        assert_eq!(configured.expose(), url);
        for bad in ["mysql://u:secret@h/d", "secret"] {
            let e = Database::parse(Some(bad)).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
        }
    }
}
