use std::fmt;

/// Everything that can go wrong in this crate. Denials are not errors: they are a
/// [`crate::Decision`]. Errors are bad profiles and bad envelopes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One or more profiles failed to parse or validate. Every problem is listed, so an
    /// admin fixes them all in one pass.
    #[error("{}", ProfileErrors(.0))]
    Profiles(Vec<ProfileError>),

    /// The input is not an AdmissionReview v1 (or not even JSON).
    #[error("{0}")]
    Review(String),

    /// The engine built a patch that does not apply to its own input. This is a bug in keyward;
    /// the admission is denied rather than risk a wrong pod.
    #[error("internal error: {0}")]
    Internal(String),
}

/// One problem in one profile: where it is, which field, what is wrong and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileError {
    /// The file (or `builtin:NAME`) the profile came from.
    pub source: String,
    /// The profile's `metadata.name`, when it could be read.
    pub profile: Option<String>,
    /// The field, as a dotted path (`spec.inject.serviceAccountToken.expirationSeconds`).
    pub field: String,
    /// What is wrong and what to do instead.
    pub reason: String,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if let Some(profile) = &self.profile {
            write!(f, ": profile {profile:?}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.reason)
    }
}

struct ProfileErrors<'a>(&'a [ProfileError]);

impl fmt::Display for ProfileErrors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
