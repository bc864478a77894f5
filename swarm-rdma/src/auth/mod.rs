//! The cluster token, and the cryptography that proves knowledge of it.
//!
//! A memory node serves one-sided reads, writes and CAS to whoever holds a queue pair
//! connected to it, so who gets a queue pair is the only access control there is.
//! `swarm init` creates a random 256-bit [`Token`]; memory nodes and clients load it
//! from a file. The bootstrap handshake ([`crate::bootstrap`]) never sends it: each
//! side sends a fresh random nonce, the memory node proves knowledge of the token
//! over the whole transcript first (so a client never answers an impostor), and the
//! client's queue pair and the node's queue pair and region travel sealed under keys
//! derived from the token and both nonces ([`session`] explains the construction and
//! why it is not Noise).
//!
//! Limits, stated plainly: this authenticates the bootstrap only. RDMA traffic after
//! it is neither encrypted nor authenticated (the RC connection and the region's
//! rkey are the capability, as on every RDMA system); run memory nodes on a trusted
//! fabric.
//!
//! Nothing here is hand-written cryptography: HMAC-SHA256 is `hmac` over `sha2`
//! (RustCrypto), proofs are checked with `Mac::verify_slice` (constant time), every
//! random byte comes from the operating system through `getrandom`, and the token's
//! bytes (and its hexadecimal text while it is parsed or written) are wiped from
//! memory when dropped (`zeroize`).

pub mod session;

use std::fmt;
use std::io;
use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use zeroize::{ZeroizeOnDrop, Zeroizing};

/// Bytes in a SHA-256 digest, the length of an HMAC-SHA256 tag.
const DIGEST_LEN: usize = 32;

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

const FINGERPRINT_LABEL: &[u8] = b"swarm-rdma v1 token fingerprint";
/// The largest token file [`Token::load`] reads (the token and whitespace fit many
/// times over).
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;

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
    /// The token file can be read or written by other users than its owner.
    #[error(
        "the cluster token file {path} is accessible to other users (mode {mode:03o}); \
         anyone who reads it gets full access to the memory nodes: run `chmod 600 {path}`"
    )]
    Exposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The token file is larger than any token file (a token is 64 hex digits).
    #[error(
        "the cluster token file {path} is larger than {limit} bytes: it is not a token file (as written by `swarm init`)"
    )]
    TooLarge {
        /// The file.
        path: String,
        /// The largest token file read.
        limit: u64,
    },
    /// The token file could not be written.
    #[error("cannot write the cluster token file {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The system random generator failed.
    #[error("cannot draw random bytes from the operating system: {0}")]
    Random(io::Error),
}

type HmacSha256 = Hmac<Sha256>;

/// A keyed HMAC-SHA256 over the concatenation of `parts`.
fn keyed_mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes keys of any length (longer ones are hashed first): never fails.
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; DIGEST_LEN] {
    keyed_mac(key, parts).finalize().into_bytes().into()
}

/// The cluster's shared secret. Its `Debug` output is redacted; log
/// [`Token::fingerprint`] to tell tokens apart. Its bytes are overwritten with zeros
/// when it is dropped.
#[derive(Clone, PartialEq, Eq, ZeroizeOnDrop)]
pub struct Token([u8; TOKEN_LEN]);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(fingerprint {})", self.fingerprint())
    }
}

impl Token {
    /// A new random token (what `swarm init` stores).
    pub fn generate() -> Result<Self, TokenError> {
        let mut token = Self([0; TOKEN_LEN]);
        fill_random(&mut token.0).map_err(TokenError::Random)?;
        Ok(token)
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
        // Decoded in place: no copy of the secret is left behind on the stack.
        let mut token = Self([0; TOKEN_LEN]);
        for (byte, pair) in token.0.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(token)
    }

    /// The hexadecimal text form, for the token file. Never log it. The text is
    /// wiped from memory when the returned value is dropped.
    pub fn to_hex(&self) -> Zeroizing<String> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = Zeroizing::new(String::with_capacity(2 * TOKEN_LEN));
        for byte in self.0 {
            text.push(char::from(DIGITS[usize::from(byte >> 4)]));
            text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
        text
    }

    /// Loads a token file written by `swarm init`. A file that group or others may
    /// read or write is refused (like ssh does with private keys): the token is
    /// the cluster's only access control.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        use std::io::Read as _;
        use std::os::unix::fs::PermissionsExt as _;
        let read_error = |source| TokenError::Read {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        // The mode of the file actually opened, not of whatever the path names now.
        let mode = file.metadata().map_err(read_error)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Exposed {
                path: path.display().to_string(),
                mode,
            });
        }
        // Bounded: a path naming a huge file (or a device) is not read whole.
        let mut text = Zeroizing::new(String::new());
        file.take(MAX_TOKEN_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read_error)?;
        if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
            return Err(TokenError::TooLarge {
                path: path.display().to_string(),
                limit: MAX_TOKEN_FILE_BYTES,
            });
        }
        Self::from_hex(&text)
    }

    /// Writes the token file, readable and writable by its owner only (mode 0600).
    /// Without `overwrite`, an existing file is an error. With it, an existing file
    /// is *replaced*: the token goes to a new file (mode 0600 from its creation) in
    /// the same directory, which is then renamed over `path`. The old file is never
    /// rewritten in place, so whoever still holds it open (or a hard link to it)
    /// keeps the old token and never sees the new one, and whatever mode the old file
    /// had does not matter.
    pub fn write(&self, path: &Path, overwrite: bool) -> Result<(), TokenError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let write_error = |source| TokenError::Write {
            path: path.display().to_string(),
            source,
        };
        let write_to = |target: &Path| -> io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(target)?;
            file.write_all(self.to_hex().as_bytes())?;
            file.sync_all()
        };
        if !overwrite {
            return write_to(path).map_err(write_error);
        }
        let name = path.file_name().ok_or_else(|| {
            write_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path names no file",
            ))
        })?;
        let suffix: [u8; 8] = random_bytes().map_err(TokenError::Random)?;
        let mut temporary = name.to_os_string();
        temporary.push(format!(".new-{}", u64::from_le_bytes(suffix)));
        let temporary = path.with_file_name(temporary);
        let written = write_to(&temporary).and_then(|()| std::fs::rename(&temporary, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written.map_err(write_error)?;
        // Make the rename itself durable (best effort: some file systems refuse to
        // sync a directory).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(dir) = std::fs::File::open(dir)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// A short public identifier of the token, safe to log: 8 hex digits of a
    /// keyed hash, which reveals nothing usable about the token itself.
    pub fn fingerprint(&self) -> String {
        hmac_sha256(&self.0, &[FINGERPRINT_LABEL])[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// A fresh nonce from the operating system's random generator.
pub fn random_nonce() -> io::Result<Nonce> {
    random_bytes()
}

/// `N` fresh bytes from the operating system's random generator: the one source
/// of randomness of this crate (nonces, tokens, cluster ids, packet sequence
/// numbers).
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    fill_random(&mut bytes)?;
    Ok(bytes)
}

/// Fills `buf` from the operating system (`getrandom(2)` on Linux).
fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    getrandom::fill(buf).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip_and_redacted_debug() {
        let token = Token::generate().unwrap();
        let hex = token.to_hex();
        let text = hex.as_str();
        assert_eq!(Token::from_hex(&format!("  {text}\n")).unwrap(), token);
        let debug = format!("{token:?}");
        assert!(!debug.contains(text), "Debug leaks the token: {debug}");
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

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// FIPS 180-4 examples: the `sha2` crate is the SHA-256 this crate expects.
    #[test]
    fn fips_180_4_examples() {
        use sha2::Digest;
        assert_eq!(
            hex(&Sha256::digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&Sha256::digest(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // One million 'a': many blocks, fed in uneven pieces.
        let mut hash = Sha256::new();
        let chunk = [b'a'; 997];
        let mut left = 1_000_000;
        while left > 0 {
            let take = left.min(chunk.len());
            hash.update(&chunk[..take]);
            left -= take;
        }
        assert_eq!(
            hex(&hash.finalize()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    /// RFC 4231 vectors through this module's HMAC helper, with messages split
    /// into parts the way proofs are built.
    #[test]
    fn rfc_4231_hmac_vectors() {
        // Test case 1.
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], &[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 2, message split in two parts.
        assert_eq!(
            hex(&hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than one block is hashed first.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn constant_time_verification_compares() {
        let tag = hmac_sha256(b"key", &[b"abc"]);
        assert!(keyed_mac(b"key", &[b"ab", b"c"]).verify_slice(&tag).is_ok());
        assert!(keyed_mac(b"key", &[b"abd"]).verify_slice(&tag).is_err());
        assert!(
            keyed_mac(b"key", &[b"abc"])
                .verify_slice(&tag[..31])
                .is_err()
        );
    }

    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("swarm-rdma-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mode_of(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn token_files_readable_by_others_are_refused_with_the_chmod_to_run() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch_dir("token-mode");
        let path = dir.join("swarm.token");
        let token = Token::generate().unwrap();
        token.write(&path, false).unwrap();
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(Token::load(&path).unwrap(), token);
        for mode in [0o640, 0o604, 0o620, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let error = Token::load(&path).unwrap_err();
            assert!(
                matches!(error, TokenError::Exposed { mode: m, .. } if m == mode),
                "{mode:o}: {error}"
            );
            assert!(
                error
                    .to_string()
                    .contains(&format!("chmod 600 {}", path.display())),
                "{error}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn overwriting_a_token_file_resets_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch_dir("token-overwrite");
        let path = dir.join("swarm.token");
        std::fs::write(
            &path,
            "an older, longer token file that was world-readable\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let token = Token::generate().unwrap();
        assert!(
            matches!(token.write(&path, false), Err(TokenError::Write { .. })),
            "an existing file is replaced only when asked"
        );
        token.write(&path, true).unwrap();
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(Token::load(&path).unwrap(), token);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn overwriting_a_token_file_replaces_it_instead_of_rewriting_it_in_place() {
        use std::io::Read as _;
        let dir = scratch_dir("token-replace");
        let path = dir.join("swarm.token");
        let old = Token::generate().unwrap();
        old.write(&path, false).unwrap();
        // Someone holds the old file open (or a hard link to it).
        let mut held = std::fs::File::open(&path).unwrap();
        let link = dir.join("link");
        std::fs::hard_link(&path, &link).unwrap();
        let new = Token::generate().unwrap();
        new.write(&path, true).unwrap();
        let mut text = String::new();
        held.read_to_string(&mut text).unwrap();
        assert_eq!(
            Token::from_hex(&text).unwrap(),
            old,
            "an open descriptor of the old file saw the new token"
        );
        assert_eq!(Token::load(&link).unwrap(), old);
        assert_eq!(Token::load(&path).unwrap(), new);
        assert_eq!(mode_of(&path), 0o600);
        // No temporary file is left behind.
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["link", "swarm.token"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_file_is_read_only_up_to_a_bound() {
        let dir = scratch_dir("token-large");
        let path = dir.join("swarm.token");
        let token = Token::generate().unwrap();
        token.write(&path, false).unwrap();
        // A token followed by a lot of whitespace: still not read whole.
        let mut text = token.to_hex().to_string();
        text.push_str(&" ".repeat(1 << 20));
        std::fs::write(&path, text).unwrap();
        let error = Token::load(&path).unwrap_err();
        assert!(matches!(error, TokenError::TooLarge { .. }), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_hex_is_lowercase_and_fixed_length() {
        let token = Token::from_bytes([0xa5; TOKEN_LEN]);
        assert_eq!(*token.to_hex(), "a5".repeat(TOKEN_LEN));
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(random_nonce().unwrap(), random_nonce().unwrap());
    }
}
