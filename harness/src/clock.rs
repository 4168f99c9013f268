//! Wall-clock time as the records write it.

/// Now, RFC 3339 in UTC with seconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
