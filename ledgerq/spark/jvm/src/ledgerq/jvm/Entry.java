package ledgerq.jvm;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.zip.CRC32;
import java.util.zip.CRC32C;

/**
 * One segment entry, decoded as docs/format.md "Decoding an entry" says (the rules of
 * ledgerq/format/entry.py decode_entry, in the same order). {@link #decode} fills a
 * reused instance and says whether the bytes are a valid, incomplete or corrupt entry.
 */
public final class Entry {
  public static final int VALID = 0;
  public static final int INCOMPLETE = 1;
  public static final int CORRUPT = 2;

  public static final int HEADER_SIZE = 22; // length, type, flags, id, timestamp
  public static final int MIN_SIZE = 26; // the header and the CRC
  public static final long MAX_SIZE = (1L << 31) - 1;
  public static final int DATA = 1;

  static final int HAS_TTL = 0x01;
  static final int HAS_HEADERS = 0x02;
  static final int COMPRESSED = 0x04;
  static final int HAS_PRIORITY = 0x08;
  static final int BATCH_CONTINUES = 0x10;
  static final int HAS_DELIVER_AT = 0x20;
  static final int HAS_GROUP = 0x40;
  static final int ENCRYPTED = 0x80;
  static final int KNOWN_FLAGS_V1 = 0x1F;
  static final int MIN_SEALED = 29;

  public long length;
  public int type; // the record type (low nibble of the type byte)
  public int flags;
  public long id;
  public long timestampNs;
  public Long expiresAtNs;
  public int priority;
  public Long deliverAtNs;
  public Map<String, String> headers;
  public byte[] buf; // the payload is buf[payloadAt, payloadAt + payloadLength)
  public int start; // the entry's first byte in buf
  public int payloadAt;
  public int payloadLength;
  public int needed; // with INCOMPLETE: bytes the entry needs in all
  public String problem; // with CORRUPT: what is wrong

  private final CRC32C crc32c = new CRC32C();
  private final CRC32 crc32 = new CRC32();

  static long u32(byte[] b, int at) {
    return (b[at] & 0xFFL) | (b[at + 1] & 0xFFL) << 8 | (b[at + 2] & 0xFFL) << 16 | (b[at + 3] & 0xFFL) << 24;
  }

  static long u64(byte[] b, int at) {
    return u32(b, at) | u32(b, at + 4) << 32;
  }

  /** Whether a type byte is one a valid entry may have (either format). */
  static boolean knownTypeByte(int kind) {
    int format = kind >> 4;
    int rtype = kind & 0xF;
    return (format == 0 || format == 2) && rtype >= 1 && rtype <= 3;
  }

  private int corrupt(String what) {
    problem = what;
    return CORRUPT;
  }

  /** Decode the entry at {@code pos} of {@code b}, whose data ends at {@code end}. */
  public int decode(byte[] b, int pos, int end) {
    int available = end - pos;
    if (available < HEADER_SIZE) {
      if (available >= 4) {
        long length = u32(b, pos);
        if (length < MIN_SIZE || length > MAX_SIZE) {
          return corrupt("impossible entry length " + length);
        }
      }
      needed = HEADER_SIZE;
      return INCOMPLETE;
    }
    length = u32(b, pos);
    if (length < MIN_SIZE || length > MAX_SIZE) {
      return corrupt("impossible entry length " + length);
    }
    if (length > available) {
      needed = (int) length;
      return INCOMPLETE;
    }
    int len = (int) length;
    int kind = b[pos + 4] & 0xFF;
    flags = b[pos + 5] & 0xFF;
    id = u64(b, pos + 6);
    timestampNs = u64(b, pos + 14);
    int format = kind >> 4;
    int knownFlags;
    long computed;
    int crcAt = pos + len - 4;
    if (format == 2) {
      crc32c.reset();
      crc32c.update(b, pos, len - 4);
      computed = crc32c.getValue();
      knownFlags = 0xFF;
    } else if (format == 0) {
      crc32.reset();
      crc32.update(b, pos, len - 4);
      computed = crc32.getValue();
      knownFlags = KNOWN_FLAGS_V1;
    } else {
      return corrupt(String.format("entry of unknown format (type byte %#04x)", kind));
    }
    if (computed != u32(b, crcAt)) {
      return corrupt("entry checksum mismatch");
    }
    type = kind & 0xF;
    if (type < 1 || type > 3) {
      return corrupt("unknown entry type " + type);
    }
    if ((flags & ~knownFlags) != 0) {
      return corrupt("unknown entry flags");
    }
    if (id == 0) {
      return corrupt("entry id 0");
    }
    int at = pos + HEADER_SIZE;
    expiresAtNs = null;
    deliverAtNs = null;
    headers = null;
    priority = 1;
    if ((flags & HAS_TTL) != 0) {
      if (at + 8 > crcAt) {
        return corrupt("entry too short for its expiry field");
      }
      expiresAtNs = u64(b, at);
      at += 8;
    }
    if ((flags & HAS_PRIORITY) != 0) {
      if (at + 1 > crcAt) {
        return corrupt("entry too short for its priority field");
      }
      priority = b[at] & 0xFF;
      if (priority > 2) {
        return corrupt("invalid priority " + priority);
      }
      at += 1;
    }
    if ((flags & HAS_DELIVER_AT) != 0) {
      if (at + 8 > crcAt) {
        return corrupt("entry too short for its deliver_at field");
      }
      deliverAtNs = u64(b, at);
      at += 8;
    }
    if ((flags & HAS_HEADERS) != 0) {
      if (at + 4 > crcAt) {
        return corrupt("entry too short for its headers length");
      }
      long hlen = u32(b, at);
      at += 4;
      if (at + hlen > crcAt) {
        return corrupt("headers run past the end of the entry");
      }
      headers = decodeHeaders(b, at, (int) hlen);
      if (headers == null) {
        return corrupt("headers are not a map of str to str");
      }
      at += (int) hlen;
    }
    if ((flags & HAS_GROUP) != 0) {
      if (at + 1 > crcAt) {
        return corrupt("entry too short for its group length");
      }
      int glen = b[at] & 0xFF;
      at += 1;
      if (glen == 0 || at + glen > crcAt) {
        return corrupt("entry group empty or running past the end of the entry");
      }
      if (utf8(b, at, glen) == null) {
        return corrupt("entry group is not UTF-8");
      }
      at += glen;
    }
    if ((flags & ENCRYPTED) != 0) {
      if ((flags & HAS_HEADERS) != 0) {
        return corrupt("an encrypted entry with headers outside its sealed payload");
      }
      if (crcAt - at < MIN_SEALED) {
        return corrupt("encrypted entry too short for its sealed payload");
      }
    }
    buf = b;
    start = pos;
    payloadAt = at;
    payloadLength = crcAt - at;
    return VALID;
  }

  // -------------------------------------------------------------------- headers

  private static String utf8(byte[] b, int at, int n) {
    CharsetDecoder decoder =
        StandardCharsets.UTF_8
            .newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT);
    try {
      return decoder.decode(ByteBuffer.wrap(b, at, n)).toString();
    } catch (CharacterCodingException exc) {
      return null;
    }
  }

  /**
   * The MessagePack map of str to str filling exactly {@code b[at, at + n)}, or null when
   * the bytes are anything else (the only shape a headers field may have; any width of
   * the map and str families is accepted, duplicate keys keep the last value).
   */
  static Map<String, String> decodeHeaders(byte[] b, int at, int n) {
    int[] cursor = {at};
    int end = at + n;
    if (n < 1) {
      return null;
    }
    int tag = b[at] & 0xFF;
    long count;
    cursor[0] = at + 1;
    if ((tag & 0xF0) == 0x80) {
      count = tag & 0x0F;
    } else if (tag == 0xDE) {
      if (end - cursor[0] < 2) {
        return null;
      }
      count = (b[cursor[0]] & 0xFF) << 8 | (b[cursor[0] + 1] & 0xFF);
      cursor[0] += 2;
    } else if (tag == 0xDF) {
      if (end - cursor[0] < 4) {
        return null;
      }
      count = be32(b, cursor[0]);
      cursor[0] += 4;
    } else {
      return null;
    }
    Map<String, String> out = new LinkedHashMap<>();
    for (long i = 0; i < count; i++) {
      String key = readStr(b, cursor, end);
      if (key == null) {
        return null;
      }
      String value = readStr(b, cursor, end);
      if (value == null) {
        return null;
      }
      out.put(key, value);
    }
    return cursor[0] == end ? out : null;
  }

  private static long be32(byte[] b, int at) {
    return (b[at] & 0xFFL) << 24 | (b[at + 1] & 0xFFL) << 16 | (b[at + 2] & 0xFFL) << 8 | (b[at + 3] & 0xFFL);
  }

  private static String readStr(byte[] b, int[] cursor, int end) {
    int at = cursor[0];
    if (at >= end) {
      return null;
    }
    int tag = b[at] & 0xFF;
    at += 1;
    long len;
    if ((tag & 0xE0) == 0xA0) {
      len = tag & 0x1F;
    } else if (tag == 0xD9) {
      if (end - at < 1) {
        return null;
      }
      len = b[at] & 0xFF;
      at += 1;
    } else if (tag == 0xDA) {
      if (end - at < 2) {
        return null;
      }
      len = (b[at] & 0xFF) << 8 | (b[at + 1] & 0xFF);
      at += 2;
    } else if (tag == 0xDB) {
      if (end - at < 4) {
        return null;
      }
      len = be32(b, at);
      at += 4;
    } else {
      return null;
    }
    if (len > end - at) {
      return null;
    }
    String text = utf8(b, at, (int) len);
    cursor[0] = at + (int) len;
    return text;
  }
}
