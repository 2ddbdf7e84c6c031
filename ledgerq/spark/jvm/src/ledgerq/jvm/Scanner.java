package ledgerq.jvm;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

/**
 * Sequential reading of a segment log with corruption skipping: a port of
 * ledgerq/segment/scanner.py TailScanner (with {@code whole_batches=False}, as the Spark
 * reader uses it), so that the JVM reader skips and stops exactly where the Python one
 * does. Bytes that are not a valid entry make it resynchronise at the next offset where
 * a valid entry with a larger id starts, searching up to the next sparse-index point;
 * the checksum work spent in vain is capped (format.checksum.recovery_crc_allowance). On
 * the live tail ({@code patient}) a plausible entry that runs past the end is an append
 * in flight: the scan stops there.
 */
public final class Scanner {
  private static final int CHUNK = 256 * 1024;
  private static final int SEARCH_WINDOW = 1 << 20;
  private static final long CRC_FACTOR = 16;
  private static final long CRC_FLOOR = 256 * 1024;

  /** Bytes [start, stop) that held no valid entry. */
  public static final class Region {
    public final long start;
    public final long stop;

    Region(long start, long stop) {
      this.start = start;
      this.stop = stop;
    }
  }

  private final FileChannel file;
  public long pos;
  public long end;
  public long lastId;
  public boolean incomplete;
  public boolean waiting;
  public final List<Region> corrupt = new ArrayList<>();
  private final long[] boundaries;
  private final boolean patient;
  private final long origin;
  private long wastedCrc;
  private byte[] buf = new byte[0];
  private int bufLen;
  private long bufStart;
  /** The entry {@link #next} returned last (reused). */
  public final Entry entry = new Entry();

  private final Entry probe = new Entry();

  public Scanner(FileChannel file, long pos, long end, long afterId, long[] boundaries, boolean patient) {
    this.file = file;
    this.pos = pos;
    this.end = end;
    this.lastId = afterId;
    this.boundaries = boundaries;
    this.patient = patient;
    this.origin = pos;
    this.bufStart = pos;
  }

  static byte[] pread(FileChannel file, int size, long at) throws IOException {
    byte[] out = new byte[size];
    int got = readInto(file, out, 0, size, at);
    if (got < size) {
      byte[] shorter = new byte[got];
      System.arraycopy(out, 0, shorter, 0, got);
      return shorter;
    }
    return out;
  }

  private static int readInto(FileChannel file, byte[] into, int offset, int size, long at) throws IOException {
    ByteBuffer bb = ByteBuffer.wrap(into, offset, size);
    int got = 0;
    while (got < size) { // short reads are legal; loop until the file really ends
      int n = file.read(bb, at + got);
      if (n <= 0) {
        break;
      }
      got += n;
    }
    return got;
  }

  private void seek(long to, long afterId) {
    pos = to;
    lastId = afterId;
    incomplete = false;
    if (!(bufStart <= to && to <= bufStart + bufLen)) {
      bufLen = 0;
      bufStart = to;
    }
  }

  private boolean fill(long needed) throws IOException {
    long availableInFile = end - pos;
    if (needed > availableInFile) {
      return false;
    }
    long have = bufStart + bufLen - pos;
    if (have >= needed) {
      return true;
    }
    int size = (int) Math.min(Math.max(needed, CHUNK), availableInFile);
    if (buf.length < size) {
      buf = new byte[size];
    }
    bufLen = readInto(file, buf, 0, size, pos);
    bufStart = pos;
    return bufLen >= needed;
  }

  /** The next valid entry (in {@link #entry}), skipping corrupt regions; false at the end. */
  public boolean next() throws IOException {
    if (waiting) {
      waiting = false;
    }
    while (true) {
      if (pos >= end) {
        return false;
      }
      long rel = pos - bufStart;
      if (rel < 0 || rel >= bufLen) {
        if (!fill(Math.min(Entry.HEADER_SIZE, end - pos))) {
          incomplete = true;
          return false;
        }
        rel = 0;
      }
      int r = entry.decode(buf, (int) rel, bufLen);
      if (r == Entry.INCOMPLETE) {
        if (fill(entry.needed)) {
          continue;
        }
        // It claims to run past the end: a torn tail - unless a valid entry follows,
        // in which case the length field itself is corrupt.
        if (!resync(pos)) {
          incomplete = true;
          return false;
        }
        continue;
      }
      if (r == Entry.CORRUPT || Long.compareUnsigned(entry.id, lastId) <= 0) {
        if (!resync(pos)) {
          incomplete = true;
          return false;
        }
        continue;
      }
      pos = bufStart + rel + entry.length;
      lastId = entry.id;
      return true;
    }
  }

  private boolean resync(long bad) throws IOException {
    if (patient && isInFlight(bad)) {
      waiting = true;
      return false;
    }
    wastedCrc += checksummedAt(bad);
    long limit = end;
    for (long b : boundaries) {
      if (b > bad) {
        limit = b;
        break;
      }
    }
    long found = search(bad + 1, limit);
    if (found < 0) {
      if (limit < end) {
        found = limit; // a sparse index point is a known entry boundary
      } else {
        return false;
      }
    }
    corrupt.add(new Region(bad, found));
    seek(found, lastId);
    return true;
  }

  private long search(long start, long limit) throws IOException {
    long at = start;
    while (at < limit) {
      long stop = Math.min(at + SEARCH_WINDOW, limit);
      byte[] data = pread(file, (int) (stop - at) + Entry.HEADER_SIZE, at);
      int n = (int) Math.min(stop - at, data.length);
      for (int rel = 0; rel < n; rel++) {
        if (isEntryAt(data, rel, at)) {
          return at + rel;
        }
      }
      at = stop;
    }
    return -1;
  }

  private boolean isEntryAt(byte[] data, int rel, long base) throws IOException {
    if (data.length - rel < Entry.HEADER_SIZE) {
      return false;
    }
    long length = Entry.u32(data, rel);
    int kind = data[rel + 4] & 0xFF;
    long id = Entry.u64(data, rel + 6);
    if (length < Entry.MIN_SIZE
        || length > Entry.MAX_SIZE
        || !Entry.knownTypeByte(kind)
        || Long.compareUnsigned(id, lastId) <= 0
        || base + rel + length > end
        || length > crcAllowance()) {
      return false;
    }
    int r;
    if (rel + length <= data.length) {
      r = probe.decode(data, rel, data.length);
    } else {
      byte[] record = pread(file, (int) length, base + rel);
      r = probe.decode(record, 0, record.length);
    }
    if (r != Entry.VALID) {
      wastedCrc += length;
      return false;
    }
    return true;
  }

  private long crcAllowance() {
    return CRC_FACTOR * (end - origin) + CRC_FLOOR - wastedCrc;
  }

  private long checksummedAt(long bad) {
    long rel = bad - bufStart;
    if (rel < 0 || bufLen - rel < 4) {
      return 0;
    }
    long length = Entry.u32(buf, (int) rel);
    boolean fits = Entry.MIN_SIZE <= length && length <= Entry.MAX_SIZE && bad + length <= end;
    return fits ? length : 0;
  }

  private boolean isInFlight(long at) throws IOException {
    long available = end - at;
    byte[] head = pread(file, (int) Math.min(Entry.HEADER_SIZE, available), at);
    if (head.length < 4) {
      return true; // not even the length is there yet
    }
    long length = Entry.u32(head, 0);
    if (!(Entry.MIN_SIZE <= length && length <= Entry.MAX_SIZE) || length <= available) {
      return false; // impossible, or all there and still invalid: damage
    }
    if (head.length < Entry.HEADER_SIZE) {
      return true;
    }
    int kind = head[4] & 0xFF;
    long id = Entry.u64(head, 6);
    return Entry.knownTypeByte(kind) && Long.compareUnsigned(id, lastId) > 0;
  }

  // ------------------------------------------------------------------ the sparse index

  /** A sparse-index point: the entry {@code id} (of time {@code ts}) starts at {@code offset}. */
  public static final class Point {
    public final long id;
    public final long ts;
    public final long offset;

    Point(long id, long ts, long offset) {
      this.id = id;
      this.ts = ts;
      this.offset = offset;
    }
  }

  /** The points of an index file; none when it is missing or damaged (read_index). */
  public static List<Point> readIndex(String path) {
    List<Point> points = new ArrayList<>();
    byte[] b;
    try {
      b = Files.readAllBytes(Paths.get(path));
    } catch (NoSuchFileException exc) {
      return points;
    } catch (IOException exc) {
      return points;
    }
    if (b.length < 12 || b[0] != 'L' || b[1] != 'Q' || b[2] != 'I' || b[3] != 'X' || Entry.u32(b, 4) != 1) {
      return points;
    }
    long count = Entry.u32(b, 8);
    long available = (b.length - 12) / 24;
    if (count != 0xFFFFFFFFL) {
      if (available < count) {
        return points; // a sealed index cut short
      }
      available = count;
    }
    for (int i = 0; i < available; i++) {
      int at = 12 + 24 * i;
      Point p = new Point(Entry.u64(b, at), Entry.u64(b, at + 8), Entry.u64(b, at + 16));
      if (!points.isEmpty()) {
        Point prev = points.get(points.size() - 1);
        if (Long.compareUnsigned(p.id, prev.id) <= 0 || Long.compareUnsigned(p.offset, prev.offset) <= 0) {
          return new ArrayList<>(); // out of order: corrupt
        }
      }
      points.add(p);
    }
    return points;
  }

  /** Id of the valid entry at {@code offset} ending by {@code size}, or -1 (entry_id_at). */
  static long entryIdAt(FileChannel file, long offset, long size) throws IOException {
    byte[] head = pread(file, Entry.HEADER_SIZE, offset);
    if (head.length < Entry.HEADER_SIZE) {
      return -1;
    }
    long length = Entry.u32(head, 0);
    if (length < Entry.MIN_SIZE || length > Entry.MAX_SIZE || offset + length > size) {
      return -1;
    }
    byte[] record = pread(file, (int) length, offset);
    Entry e = new Entry();
    if (e.decode(record, 0, record.length) != Entry.VALID) {
      return -1;
    }
    return e.id;
  }

  /** Where to scan from to meet id {@code target}: {offset, id before it} (checked_start). */
  static long[] checkedStart(FileChannel file, List<Point> points, long size, long target, long firstId)
      throws IOException {
    for (int i = points.size() - 1; i >= 0; i--) {
      Point p = points.get(i);
      if (Long.compareUnsigned(p.id, target) > 0 || p.offset >= size) {
        continue;
      }
      if (entryIdAt(file, p.offset, size) == p.id) {
        return new long[] {p.offset, p.id - 1};
      }
    }
    return new long[] {0, firstId - 1};
  }
}
