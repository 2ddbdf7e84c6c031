package ledgerq.jvm;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Map;

import com.github.luben.zstd.ZstdInputStream;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The rows of one planned segment read: ledgerq/spark/_scan.py's scan of a task, in the
 * JVM. It starts where the Python reader starts (the checked sparse-index point no
 * wanted row precedes), walks the entries with {@link Scanner} (the port of the
 * resynchronising scanner), skips and logs (or, with FAILFAST, raises on) what the
 * Python reader skips, and applies the pushed-down id and time bounds exactly.
 */
public final class SegmentRows implements PartitionReader<InternalRow> {
  private static final Logger LOG = LoggerFactory.getLogger("ledgerq");
  private static final long MAX_VIEW_PAYLOAD = 1L << 30;
  private static final MapData EMPTY_MAP =
      new ArrayBasedMapData(new GenericArrayData(new Object[0]), new GenericArrayData(new Object[0]));
  private static final UTF8String PENDING = UTF8String.fromString("pending");
  private static final UTF8String LEASED = UTF8String.fromString("leased");
  private static final UTF8String ACKED = UTF8String.fromString("acked");

  // column kinds, by position in the read schema
  private static final int QUEUE = 0, ID = 1, TS = 2, EXPIRES = 3, PRIORITY = 4, HEADERS = 5, PAYLOAD = 6,
      DELIVER = 7, STATE = 8;

  private final SegmentTask task;
  private final String path;
  private final int[] kinds;
  private final UTF8String queue;
  private final GenericInternalRow row;
  private final Long idHi; // the highest wanted id (id_hi and ids)
  private final boolean filtering;
  private final boolean wantsPayload;
  private final Sealer sealer; // an encrypted queue's (planned with its key)
  private FileChannel file;
  private Scanner scanner;
  private boolean done;
  private long previous;
  private int reported;

  /** Counts for the summary line and for the spec test. */
  public long rows, corruptRegions, corruptBytes, lostMessages;

  public SegmentRows(SegmentTask task, StructType schema) {
    this.task = task;
    this.path = task.logPath();
    String[] names = schema.fieldNames();
    kinds = new int[names.length];
    for (int i = 0; i < names.length; i++) {
      kinds[i] = kindOf(names[i]);
    }
    queue = UTF8String.fromString(task.queue);
    row = new GenericInternalRow(names.length);
    boolean payload = false;
    for (int k : kinds) {
      payload |= k == PAYLOAD;
    }
    wantsPayload = payload;
    sealer = task.encryptionKeyHex == null ? null : new Sealer(task.encryptionKeyHex, task.queueIdHex);
    Long hi = task.idHi;
    if (task.maxId != null) {
      hi = hi == null ? task.maxId : Math.min(hi, task.maxId);
    }
    idHi = hi;
    filtering = task.idLo > 1 || task.idHi != null || task.ids != null || task.tsLo != null || task.tsHi != null;
  }

  private static int kindOf(String name) {
    switch (name) {
      case "queue": return QUEUE;
      case "id": return ID;
      case "timestamp": return TS;
      case "expires_at": return EXPIRES;
      case "priority": return PRIORITY;
      case "headers": return HEADERS;
      case "payload": return PAYLOAD;
      case "deliver_at": return DELIVER;
      case "state": return STATE;
      default: throw new IllegalArgumentException("ledgerq has no column " + name);
    }
  }

  private void open() throws IOException {
    try {
      file = FileChannel.open(Paths.get(path), StandardOpenOption.READ);
    } catch (NoSuchFileException exc) {
      String message = "segment " + path + " was deleted before it could be read (retention, or the "
          + "queue was removed); its messages are not in the result";
      if (task.failfast) {
        throw new IllegalStateException(message);
      }
      LOG.warn("ledgerq: {}", message);
      done = true;
      return;
    }
    long size = file.size();
    long end = task.sizeLimit == null ? size : Math.min(size, task.sizeLimit);
    List<Scanner.Point> points = Scanner.readIndex(task.indexPath());
    long accept = task.idLo;
    if (task.minId != null) {
      accept = Math.max(accept, task.minId);
    }
    if (task.seekByTime && task.tsLo != null) {
      // the last point of the leading run of points older than ts_lo
      long loNs = task.tsLo * 1000;
      long runEnd = 0;
      for (Scanner.Point p : points) {
        if (p.ts >= loNs) {
          break;
        }
        runEnd = p.id;
      }
      accept = Math.max(accept, runEnd);
    }
    long[] start = accept <= task.firstId
        ? new long[] {0, task.firstId - 1}
        : Scanner.checkedStart(file, points, end, accept, task.firstId);
    long[] boundaries = new long[points.size()];
    for (int i = 0; i < boundaries.length; i++) {
      boundaries[i] = points.get(i).offset;
    }
    scanner = new Scanner(file, start[0], end, start[1], boundaries, task.liveTail);
    previous = start[1];
  }

  @Override
  public boolean next() throws IOException {
    if (scanner == null && !done) {
      open();
    }
    while (!done) {
      if (!scanner.next()) {
        done = true;
        if (scanner.pos < scanner.end && !task.liveTail) {
          corrupt(scanner.pos, scanner.end, -1); // a sealed segment ends in bytes that hold no entry
        }
        summary();
        return false;
      }
      Entry e = scanner.entry;
      if (scanner.corrupt.size() > reported) {
        for (int i = reported; i < scanner.corrupt.size(); i++) {
          Scanner.Region region = scanner.corrupt.get(i);
          corrupt(region.start, region.stop, e.id - previous - 1);
        }
        reported = scanner.corrupt.size();
      }
      previous = e.id;
      if (idHi != null && e.id > idHi) {
        done = true;
        summary();
        return false;
      }
      boolean made = e.type == Entry.DATA && make(e);
      if (idHi != null && e.id >= idHi) {
        done = true; // nothing later is wanted
      }
      if (made) {
        rows++;
        return true;
      }
    }
    return false;
  }

  private boolean keep(long id, long tsUs) {
    return (task.idLo <= 1 || id >= task.idLo)
        && (task.idHi == null || id <= task.idHi)
        && (task.ids == null || task.ids.contains(id))
        && (task.tsLo == null || tsUs >= task.tsLo)
        && (task.tsHi == null || tsUs <= task.tsHi);
  }

  private boolean make(Entry e) throws IOException {
    // Opened before the row filter, as the Python reader does: a damaged payload is
    // reported (or fails a FAILFAST read) whether or not its row is wanted.
    byte[] src = e.buf;
    int at = e.payloadAt;
    int length = e.payloadLength;
    Map<String, String> headers = e.headers;
    if (sealer != null || (e.flags & Entry.ENCRYPTED) != 0) {
      // An encrypted queue: every entry must open (one that is not sealed is a forgery).
      if (sealer == null) {
        skip(e, "it is encrypted: read with option encryption_key_hex");
        return false;
      }
      Sealer.Opened opened = sealer.open(e);
      if (opened == null) {
        skip(e, sealer.problem);
        return false;
      }
      src = opened.body;
      at = 0;
      length = src.length;
      headers = opened.headers;
    }
    byte[] payload = null;
    if ((e.flags & Entry.COMPRESSED) != 0) {
      payload = unzstd(e, src, at, length);
      if (payload == null) {
        return false;
      }
    }
    long tsUs = e.timestampNs / 1000; // truncated toward zero, as the Python reader
    if (filtering && !keep(e.id, tsUs)) {
      return false;
    }
    if (payload == null && wantsPayload) {
      payload = at == 0 && length == src.length ? src : java.util.Arrays.copyOfRange(src, at, at + length);
    }
    for (int i = 0; i < kinds.length; i++) {
      switch (kinds[i]) {
        case QUEUE: row.update(i, queue); break;
        case ID: row.update(i, e.id); break;
        case TS: row.update(i, tsUs); break;
        case EXPIRES: row.update(i, e.expiresAtNs == null ? null : e.expiresAtNs / 1000); break;
        case PRIORITY: row.update(i, e.priority); break;
        case HEADERS: row.update(i, headers == null ? EMPTY_MAP : map(headers)); break;
        case PAYLOAD: row.update(i, payload); break;
        case DELIVER: row.update(i, e.deliverAtNs == null ? null : e.deliverAtNs / 1000); break;
        default: row.update(i, stateOf(e.id)); break;
      }
    }
    return true;
  }

  private UTF8String stateOf(long id) {
    if (task.stateHead == null) {
      return null;
    }
    if (id < task.stateHead || (task.stateDone != null && task.stateDone.contains(id))) {
      return ACKED;
    }
    return task.stateLeased != null && task.stateLeased.contains(id) ? LEASED : PENDING;
  }

  private static MapData map(Map<String, String> headers) {
    Object[] keys = new Object[headers.size()];
    Object[] values = new Object[headers.size()];
    int i = 0;
    for (Map.Entry<String, String> kv : headers.entrySet()) {
      keys[i] = UTF8String.fromString(kv.getKey());
      values[i] = UTF8String.fromString(kv.getValue());
      i++;
    }
    return new ArrayBasedMapData(new GenericArrayData(keys), new GenericArrayData(values));
  }

  private byte[] unzstd(Entry e, byte[] src, int at, int length) throws IOException {
    String problem;
    try (ZstdInputStream in = new ZstdInputStream(new ByteArrayInputStream(src, at, length))) {
      ByteArrayOutputStream out = new ByteArrayOutputStream();
      byte[] chunk = new byte[1 << 16];
      long total = 0;
      int n;
      while ((n = in.read(chunk)) > 0) {
        total += n;
        if (total > MAX_VIEW_PAYLOAD) {
          skip(e, "message " + e.id + " decompresses to more than max_message_size=" + MAX_VIEW_PAYLOAD + " bytes");
          return null;
        }
        out.write(chunk, 0, n);
      }
      return out.toByteArray();
    } catch (IOException | RuntimeException exc) {
      problem = "message " + e.id + " has a damaged zstd payload (" + exc.getMessage() + ")";
    }
    skip(e, problem);
    return null;
  }

  private void skip(Entry e, String problem) {
    if (task.failfast) {
      throw new IllegalStateException("message " + e.id + ": " + problem + " (" + path + ")");
    }
    LOG.warn("ledgerq: skipping message {} in {}: {}", e.id, path, problem);
    corruptRegions++;
    lostMessages++;
  }

  private void corrupt(long start, long stop, long lost) {
    String what = lost >= 0 ? lost + " message" + (lost != 1 ? "s" : "") + " lost" : "at the end";
    if (task.failfast) {
      throw new IllegalStateException(
          (stop - start) + " corrupt bytes (" + what + "); mode=FAILFAST stops the read (" + path + " at offset "
              + start + ")");
    }
    LOG.warn("ledgerq: skipped {} corrupt bytes in {} at offset {} ({})", stop - start, path, start, what);
    corruptRegions++;
    corruptBytes += stop - start;
    lostMessages += Math.max(lost, 0);
  }

  private void summary() {
    if (corruptRegions > 0) {
      LOG.warn("ledgerq: read {} rows of queue {} from {}; {} corrupt regions skipped ({} bytes, {} messages lost)",
          rows, task.queue, path, corruptRegions, corruptBytes, lostMessages);
    }
  }

  @Override
  public InternalRow get() {
    return row;
  }

  @Override
  public void close() throws IOException {
    if (file != null) {
      file.close();
    }
  }

  /** Every row of a task, for {@link Dump}. */
  static void forEach(SegmentRows rows, java.util.function.Consumer<InternalRow> sink) {
    try {
      while (rows.next()) {
        sink.accept(rows.get());
      }
      rows.close();
    } catch (IOException exc) {
      throw new UncheckedIOException(exc);
    }
  }
}
