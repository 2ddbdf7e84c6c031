package ledgerq.jvm;

import java.security.GeneralSecurityException;
import java.util.HexFormat;
import java.util.Map;

import javax.crypto.AEADBadTagException;
import javax.crypto.Cipher;
import javax.crypto.Mac;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * Opening the sealed entries of an encrypted queue (docs/format.md "Encrypted
 * entries"; ledgerq/format/sealing.py EntrySealer.open): AES-256-GCM under
 * HKDF-SHA256(key, salt = queue_id, info = "ledgerq entry key v1"), the associated data
 * the queue_id followed by the entry's bytes before its payload field.
 */
final class Sealer {
  private static final int NONCE_SIZE = 12;
  private static final int TAG_BITS = 128;
  private static final int MIN_SEALED_SIZE = 29;
  private static final int CONTENT_HAS_HEADERS = 0x02;
  private static final byte[] ENTRY_KEY_INFO = "ledgerq entry key v1".getBytes(java.nio.charset.StandardCharsets.US_ASCII);

  private final byte[] queueId;
  private final SecretKeySpec entryKey;
  private final Cipher cipher;

  /** The opened content of an entry: headers (null: none) and the body. */
  static final class Opened {
    Map<String, String> headers;
    byte[] body;
  }

  /** Why the last {@link #open} gave null. */
  String problem;

  Sealer(String keyHex, String queueIdHex) {
    HexFormat hex = HexFormat.of();
    this.queueId = hex.parseHex(queueIdHex);
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(queueId, "HmacSHA256")); // HKDF extract: salt = queue_id
      byte[] prk = mac.doFinal(hex.parseHex(keyHex));
      mac.init(new SecretKeySpec(prk, "HmacSHA256")); // expand: one block is 32 bytes
      mac.update(ENTRY_KEY_INFO);
      mac.update((byte) 1);
      entryKey = new SecretKeySpec(mac.doFinal(), "AES");
      cipher = Cipher.getInstance("AES/GCM/NoPadding");
    } catch (GeneralSecurityException exc) {
      throw new IllegalStateException("AES-256-GCM or HMAC-SHA256 is not available", exc);
    }
  }

  /** The content of sealed entry {@code e}, or null (see {@link #problem}) when it cannot be opened. */
  Opened open(Entry e) {
    if ((e.flags & Entry.ENCRYPTED) == 0) {
      problem = "message " + e.id + " is not sealed, and every entry of an encrypted queue is "
          + "(written without the key, or its seal stripped)";
      return null;
    }
    if (e.payloadLength < MIN_SEALED_SIZE) {
      problem = "message " + e.id + ": sealed payload too short";
      return null;
    }
    byte[] content;
    try {
      cipher.init(Cipher.DECRYPT_MODE, entryKey, new GCMParameterSpec(TAG_BITS, e.buf, e.payloadAt, NONCE_SIZE));
      cipher.updateAAD(queueId);
      cipher.updateAAD(e.buf, e.start, e.payloadAt - e.start);
      content = cipher.doFinal(e.buf, e.payloadAt + NONCE_SIZE, e.payloadLength - NONCE_SIZE);
    } catch (AEADBadTagException exc) {
      problem = "message " + e.id + " fails authentication (tampered, moved from another "
          + "position or queue, or sealed under another key)";
      return null;
    } catch (GeneralSecurityException exc) {
      throw new IllegalStateException("AES-256-GCM failed: " + exc, exc);
    }
    int flags = content[0] & 0xFF;
    int at = 1;
    Opened out = new Opened();
    if ((flags & ~CONTENT_HAS_HEADERS) != 0) {
      problem = "message " + e.id + ": unknown sealed content flags";
      return null;
    }
    if (flags != 0) {
      if (content.length < at + 4) {
        problem = "message " + e.id + ": sealed headers cut short";
        return null;
      }
      long hlen = Entry.u32(content, at);
      at += 4;
      if (at + hlen > content.length) {
        problem = "message " + e.id + ": sealed headers run past the end";
        return null;
      }
      out.headers = Entry.decodeHeaders(content, at, (int) hlen);
      if (out.headers == null) {
        problem = "headers are not a map of str to str";
        return null;
      }
      at += (int) hlen;
    }
    out.body = java.util.Arrays.copyOfRange(content, at, content.length);
    return out;
  }
}
