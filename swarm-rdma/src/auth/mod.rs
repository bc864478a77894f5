//! The cluster token and the challenge-response that proves knowledge of it.
//!
//! A memory node serves one-sided reads, writes and CAS to whoever holds a queue pair
//! connected to it, so who gets a queue pair is the only access control there is.
//! `swarm init` creates a random 256-bit [`Token`]; memory nodes and clients load it
//! from a file. The bootstrap handshake ([`crate::bootstrap`]) never sends it: each
//! side sends a fresh random nonce and proves knowledge of the token with
//! `HMAC-SHA256(token, label ‖ client nonce ‖ server nonce)`, with a different label
//! per direction so that a proof cannot be reflected back. The memory node proves
//! itself first, so a client never answers an impostor's challenge.
//!
//! Limits, stated plainly: this authenticates the bootstrap only. RDMA traffic after
//! it is neither encrypted nor authenticated (the RC connection and the region's
//! rkey are the capability, as on every RDMA system); run memory nodes on a trusted
//! fabric. HMAC-SHA256 comes from [`sha256`], an interim, test-vector-checked
//! implementation until the workspace depends on the `sha2`/`hmac` crates.

pub mod sha256;

use std::fmt;
use std::io;
use std::path::Path;

use sha256::{DIGEST_LEN, constant_time_eq, hmac_sha256};

/// Bytes in a cluster token.
pub const TOKEN_LEN: usize = 32;
/// Bytes in a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes in a proof of token knowledge.
pub const PROOF_LEN: usize = DIGEST_LEN;

/// A fresh random handshake nonce.
pub type Nonce = [u8; NONCE_LEN];
/// A proof that its sender knows the cluster token.
pub type Proof = [u8; PROOF_LEN];

const SERVER_LABEL: &[u8] = b"swarm-rdma v1 memory node proof";
const CLIENT_LABEL: &[u8] = b"swarm-rdma v1 client proof";
const FINGERPRINT_LABEL: &[u8] = b"swarm-rdma v1 token fingerprint";

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read.
    #[error("cannot read the cluster token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The text is not 64 hexadecimal digits.
    #[error(
        "the cluster token must be {} hexadecimal digits (as written by `swarm init`), found {found} characters",
        2 * TOKEN_LEN
    )]
    BadFormat {
        /// Characters found after trimming whitespace.
        found: usize,
    },
    /// The system random generator failed.
    #[error("cannot draw random bytes from the operating system: {0}")]
    Random(io::Error),
}

/// The cluster's shared secret. Its `Debug` output is redacted; log
/// [`Token::fingerprint`] to tell tokens apart.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; TOKEN_LEN]);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(fingerprint {})", self.fingerprint())
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        self.0 = [0; TOKEN_LEN];
        std::hint::black_box(&self.0);
    }
}

impl Token {
    /// A new random token (what `swarm init` stores).
    pub fn generate() -> Result<Self, TokenError> {
        let mut bytes = [0u8; TOKEN_LEN];
        fill_random(&mut bytes).map_err(TokenError::Random)?;
        Ok(Self(bytes))
    }

    /// A token from its raw bytes.
    pub const fn from_bytes(bytes: [u8; TOKEN_LEN]) -> Self {
        Self(bytes)
    }

    /// Parses the hexadecimal text form (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self, TokenError> {
        let text = text.trim();
        let bad = || TokenError::BadFormat {
            found: text.chars().count(),
        };
        if text.len() != 2 * TOKEN_LEN || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; TOKEN_LEN];
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }

    /// The hexadecimal text form, for the token file. Never log it.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Loads a token file written by `swarm init`.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_hex(&text)
    }

    /// A short public identifier of the token, safe to log: 8 hex digits of a
    /// keyed hash, which reveals nothing usable about the token itself.
    pub fn fingerprint(&self) -> String {
        hmac_sha256(&self.0, &[FINGERPRINT_LABEL])[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The memory node's proof for a handshake.
    pub fn server_proof(&self, client_nonce: &Nonce, server_nonce: &Nonce) -> Proof {
        hmac_sha256(&self.0, &[SERVER_LABEL, client_nonce, server_nonce])
    }

    /// The client's proof for a handshake.
    pub fn client_proof(&self, client_nonce: &Nonce, server_nonce: &Nonce) -> Proof {
        hmac_sha256(&self.0, &[CLIENT_LABEL, client_nonce, server_nonce])
    }
}

/// Checks a received proof against the expected one, in constant time.
pub fn proof_matches(expected: &Proof, received: &Proof) -> bool {
    constant_time_eq(expected, received)
}

/// A fresh nonce from the operating system's random generator.
pub fn random_nonce() -> io::Result<Nonce> {
    let mut nonce = [0u8; NONCE_LEN];
    fill_random(&mut nonce)?;
    Ok(nonce)
}

/// Fills `buf` from `getrandom(2)`, retrying on interruption and short reads.
fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the
        // duration of the call; getrandom writes at most that many bytes into it.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += got as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip_and_redacted_debug() {
        let token = Token::generate().unwrap();
        let text = token.to_hex();
        assert_eq!(Token::from_hex(&format!("  {text}\n")).unwrap(), token);
        let debug = format!("{token:?}");
        assert!(!debug.contains(&text), "Debug leaks the token: {debug}");
        assert!(debug.contains(&token.fingerprint()));
    }

    #[test]
    fn malformed_hex_is_refused() {
        assert!(matches!(
            Token::from_hex("abc"),
            Err(TokenError::BadFormat { found: 3 })
        ));
        let not_hex = "zz".repeat(TOKEN_LEN);
        assert!(Token::from_hex(&not_hex).is_err());
        // 64 characters but multi-byte: refused, no panic on char boundaries.
        let unicode = "é".repeat(TOKEN_LEN);
        assert!(Token::from_hex(&unicode).is_err());
    }

    #[test]
    fn proofs_depend_on_token_direction_and_nonces() {
        let a = Token::from_bytes([1; TOKEN_LEN]);
        let b = Token::from_bytes([2; TOKEN_LEN]);
        let (nc, ns) = ([3; NONCE_LEN], [4; NONCE_LEN]);
        let proof = a.server_proof(&nc, &ns);
        assert!(proof_matches(&proof, &a.server_proof(&nc, &ns)));
        assert!(!proof_matches(&proof, &b.server_proof(&nc, &ns)));
        assert!(!proof_matches(&proof, &a.client_proof(&nc, &ns)));
        assert!(!proof_matches(&proof, &a.server_proof(&ns, &nc)));
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(random_nonce().unwrap(), random_nonce().unwrap());
    }
}
