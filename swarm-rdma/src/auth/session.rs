//! The handshake's cryptography: a transcript of every frame exchanged, proofs bound
//! to it, and sealed (encrypted and authenticated) queue-pair and region details.
//!
//! Why these pieces, and not a bare nonce challenge: a proof that covers only the
//! nonces says "someone with the token is at the other end", not "the queue pair and
//! the rkey in this message come from that someone". An on-path relay could forward
//! the proofs and swap the client's queue pair for its own, then read the region's
//! address and rkey in clear: full access without the token. So every message after
//! `ClientHello` is authenticated over the *whole transcript* — both nonces and every
//! byte of every earlier frame, plus the message's own header and clear fields —
//! and the fields that grant access are encrypted:
//!
//! - **Transcript**: SHA-256 over the exact bytes of every frame, in order.
//! - **Proofs** (the memory node's `ServerHello` and `Refuse`): HMAC-SHA256 under the
//!   token of a label, the transcript digest so far, and the message's bytes before
//!   the proof. Checked with `Mac::verify_slice` (constant time).
//! - **Sealed messages** (`ClientAuth`'s queue pair, `Accept`'s queue pair and
//!   region): ChaCha20-Poly1305 under a per-handshake, per-direction key derived with
//!   HKDF-SHA256 from the token, salted with both nonces; the associated data is the
//!   transcript digest and the frame header. Each message sealed under a key has its
//!   own nonce, its index in its direction (the handshake's is 0, later requests
//!   such as a lease watch count up); keys never repeat because the client's nonce is
//!   fresh (a memory node that reuses its nonce cannot make a key repeat).
//!
//! Why not Noise (`snow`, `Noise_NNpsk0`): it would add an ephemeral Diffie-Hellman,
//! i.e. forward secrecy, which buys nothing here. The token *is* the capability: whoever
//! steals it later can simply connect and receive a fresh rkey, so protecting
//! recorded past handshakes from a future token thief protects nothing, and the RDMA
//! traffic itself is clear text on the wire anyway. What the handshake must give —
//! mutual proof of the token, integrity of every field, confidentiality of rkeys and
//! PSNs, freshness against replay — these four primitives from well-kept crates
//! give, with a transcript small enough to read in one screen
//! ([`crate::bootstrap`]).

use chacha20poly1305::{AeadInOut, ChaCha20Poly1305, Key, KeyInit as _, Nonce as AeadNonce, Tag};
use hkdf::Hkdf;
use hmac::Mac;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::{Nonce, PROOF_LEN, Proof, Token, keyed_mac};

/// Bytes of the authentication tag appended to a sealed message.
pub const TAG_LEN: usize = 16;

/// The authentication tag of a sealed message.
pub type SealTag = [u8; TAG_LEN];

const NODE_PROOF_LABEL: &[u8] = b"swarm-rdma v2 memory node proof";
const CLIENT_KEY_LABEL: &[u8] = b"swarm-rdma v2 client-to-node seal key";
const NODE_KEY_LABEL: &[u8] = b"swarm-rdma v2 node-to-client seal key";

/// Who sealed a message: each direction has its own key, so a message cannot be
/// reflected back to its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// The client (its `ClientAuth`).
    Client,
    /// The memory node (its `Accept`).
    MemoryNode,
}

/// The running hash of every frame exchanged so far.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    hash: Sha256,
}

impl Transcript {
    /// An empty transcript (before `ClientHello`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a frame, exactly as sent or received.
    pub fn record(&mut self, frame: &[u8]) {
        self.hash.update(frame);
    }

    fn digest(&self) -> [u8; 32] {
        self.hash.clone().finalize().into()
    }
}

impl Token {
    /// The memory node's proof of a message: `prefix` is the message's frame up to
    /// (not including) the proof; `transcript` holds every earlier frame.
    pub fn prove(&self, transcript: &Transcript, prefix: &[u8]) -> Proof {
        self.proof_mac(transcript, prefix)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is the memory node's proof of the message (constant time).
    pub fn verify(&self, transcript: &Transcript, prefix: &[u8], proof: &Proof) -> bool {
        self.proof_mac(transcript, prefix)
            .verify_slice(proof)
            .is_ok()
    }

    fn proof_mac(&self, transcript: &Transcript, prefix: &[u8]) -> hmac::Hmac<Sha256> {
        keyed_mac(&self.0, &[NODE_PROOF_LABEL, &transcript.digest(), prefix])
    }

    /// The keys of the handshake with these nonces.
    pub fn session_keys(&self, client_nonce: &Nonce, server_nonce: &Nonce) -> SessionKeys {
        let mut salt = [0u8; 2 * super::NONCE_LEN];
        salt[..super::NONCE_LEN].copy_from_slice(client_nonce);
        salt[super::NONCE_LEN..].copy_from_slice(server_nonce);
        let hkdf = Hkdf::<Sha256>::new(Some(&salt), &self.0);
        let expand = |label: &[u8]| {
            let mut key = Zeroizing::new([0u8; 32]);
            // 32 bytes is far below HKDF-SHA256's 8160-byte limit: never fails.
            hkdf.expand(label, key.as_mut())
                .expect("HKDF-SHA256 can expand 32 bytes");
            key
        };
        SessionKeys {
            client: expand(CLIENT_KEY_LABEL),
            node: expand(NODE_KEY_LABEL),
        }
    }
}

const _: () = assert!(PROOF_LEN == 32);

/// The two sealing keys of one handshake (wiped from memory when dropped).
pub struct SessionKeys {
    client: Zeroizing<[u8; 32]>,
    node: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys { .. }")
    }
}

impl SessionKeys {
    fn cipher(&self, sender: Sender) -> ChaCha20Poly1305 {
        let key = match sender {
            Sender::Client => &self.client,
            Sender::MemoryNode => &self.node,
        };
        // Borrowed, not copied: `Key::from(**key)` would leave unzeroed copies of the
        // key on the stack (the cipher wipes its own copy when dropped).
        ChaCha20Poly1305::new(Key::cast_from_core(key))
    }

    /// Encrypts `plaintext` in place and returns its tag. `header` is the frame
    /// header of the message carrying it; `transcript` holds every earlier frame.
    /// The handshake's one message per direction (`ClientAuth`, `Accept`).
    pub fn seal(
        &self,
        sender: Sender,
        transcript: &Transcript,
        header: &[u8],
        plaintext: &mut [u8],
    ) -> SealTag {
        self.seal_nth(sender, 0, transcript, header, plaintext)
    }

    /// [`SessionKeys::seal`] for the `n`th message `sender` seals with these keys
    /// (0: the handshake's; 1, 2, ...: requests after it, such as a lease watch):
    /// each message has its own AEAD nonce, so no nonce repeats under one key.
    pub fn seal_nth(
        &self,
        sender: Sender,
        n: u64,
        transcript: &Transcript,
        header: &[u8],
        plaintext: &mut [u8],
    ) -> SealTag {
        let aad = associated_data(transcript, header);
        // Only fails for messages beyond ChaCha20's 256 GiB limit.
        self.cipher(sender)
            .encrypt_inout_detached(&message_nonce(n), &aad, plaintext.into())
            .expect("a handshake message is far below the AEAD's size limit")
            .into()
    }

    /// Decrypts `ciphertext` in place if `tag` authenticates it, its header and the
    /// transcript; on failure the buffer's content is unspecified (wipe or drop it).
    pub fn open(
        &self,
        sender: Sender,
        transcript: &Transcript,
        header: &[u8],
        ciphertext: &mut [u8],
        tag: &SealTag,
    ) -> bool {
        self.open_nth(sender, 0, transcript, header, ciphertext, tag)
    }

    /// [`SessionKeys::open`] for the `n`th message of `sender`.
    pub fn open_nth(
        &self,
        sender: Sender,
        n: u64,
        transcript: &Transcript,
        header: &[u8],
        ciphertext: &mut [u8],
        tag: &SealTag,
    ) -> bool {
        let aad = associated_data(transcript, header);
        self.cipher(sender)
            .decrypt_inout_detached(&message_nonce(n), &aad, ciphertext.into(), &Tag::from(*tag))
            .is_ok()
    }
}

/// The AEAD nonce of a direction's `n`th sealed message: `n`, little endian. The
/// receiver counts messages itself (TCP keeps them in order), so a replayed or
/// reordered message fails to open.
fn message_nonce(n: u64) -> AeadNonce {
    let mut nonce = AeadNonce::default();
    nonce[..8].copy_from_slice(&n.to_le_bytes());
    nonce
}

fn associated_data(transcript: &Transcript, header: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(32 + header.len());
    aad.extend_from_slice(&transcript.digest());
    aad.extend_from_slice(header);
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(byte: u8) -> Token {
        Token::from_bytes([byte; super::super::TOKEN_LEN])
    }

    #[test]
    fn proofs_cover_the_transcript_and_the_message() {
        let a = token(1);
        let mut transcript = Transcript::new();
        transcript.record(b"client hello");
        let proof = a.prove(&transcript, b"server hello prefix");
        assert!(a.verify(&transcript, b"server hello prefix", &proof));
        assert!(!token(2).verify(&transcript, b"server hello prefix", &proof));
        assert!(!a.verify(&transcript, b"server hello prefiy", &proof));
        let mut other = Transcript::new();
        other.record(b"client hellp");
        assert!(!a.verify(&other, b"server hello prefix", &proof));
    }

    #[test]
    fn sealed_messages_open_only_with_the_same_keys_direction_transcript_and_header() {
        let a = token(1);
        let keys = a.session_keys(&[3; 32], &[4; 32]);
        let mut transcript = Transcript::new();
        transcript.record(b"frames so far");
        let secret = *b"queue pair and rkey";
        let mut buf = secret;
        let tag = keys.seal(Sender::MemoryNode, &transcript, b"header", &mut buf);
        assert_ne!(buf, secret, "sealed bytes are not the plaintext");
        let sealed = buf;

        let opens = |keys: &SessionKeys, sender, transcript: &Transcript, header: &[u8]| {
            let mut buf = sealed;
            keys.open(sender, transcript, header, &mut buf, &tag) && buf == secret
        };
        assert!(opens(&keys, Sender::MemoryNode, &transcript, b"header"));
        assert!(!opens(&keys, Sender::Client, &transcript, b"header"));
        assert!(!opens(&keys, Sender::MemoryNode, &transcript, b"headex"));
        assert!(!opens(
            &keys,
            Sender::MemoryNode,
            &Transcript::new(),
            b"header"
        ));
        let other_nonce = a.session_keys(&[3; 32], &[5; 32]);
        assert!(!opens(
            &other_nonce,
            Sender::MemoryNode,
            &transcript,
            b"header"
        ));
        let other_token = token(2).session_keys(&[3; 32], &[4; 32]);
        assert!(!opens(
            &other_token,
            Sender::MemoryNode,
            &transcript,
            b"header"
        ));
        // Later messages have their own nonce: one sealed as message 1 opens only
        // as message 1.
        let mut later = secret;
        let tag1 = keys.seal_nth(Sender::Client, 1, &transcript, b"header", &mut later);
        let opens_nth = |n| {
            let mut buf = later;
            keys.open_nth(Sender::Client, n, &transcript, b"header", &mut buf, &tag1)
                && buf == secret
        };
        assert!(opens_nth(1));
        assert!(!opens_nth(0) && !opens_nth(2));
        let mut flipped = sealed;
        flipped[0] ^= 1;
        assert!(!keys.open(
            Sender::MemoryNode,
            &transcript,
            b"header",
            &mut flipped,
            &tag
        ));
    }
}
