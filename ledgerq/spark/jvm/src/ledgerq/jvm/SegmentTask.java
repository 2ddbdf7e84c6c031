package ledgerq.jvm;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.HashSet;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * One planned segment read: the fields of ledgerq/spark/_task.py SegmentTask, read from
 * the JSON text of _plan.py task_to_json. Bounds are inclusive; times in microseconds.
 */
public final class SegmentTask {
  private static final ObjectMapper JSON = new ObjectMapper();

  public String queue;
  public String path;
  public long firstId;
  public Long nextFirstId;
  public Long sizeLimit;
  public boolean liveTail;
  public long idLo = 1;
  public Long idHi;
  public Set<Long> ids;
  public Long minId; // the smallest of ids
  public Long maxId; // the largest of ids
  public Long tsLo;
  public Long tsHi;
  public boolean seekByTime;
  public Long stateHead; // with option reader: its state
  public Set<Long> stateDone;
  public Set<Long> stateLeased;
  public boolean failfast;
  public Long nameId;
  public String[] columns;
  public String encryptionKeyHex;
  public String queueIdHex; // with a key: the queue's identity (meta.json's encryption)

  /** Parse the JSON text of a task. */
  public static SegmentTask fromJson(String text) {
    JsonNode raw;
    try {
      raw = JSON.readTree(text);
    } catch (IOException exc) {
      throw new UncheckedIOException(exc);
    }
    SegmentTask t = new SegmentTask();
    t.queue = raw.get("queue").asText();
    t.path = raw.get("path").asText();
    t.firstId = raw.get("first_id").asLong();
    t.nextFirstId = optLong(raw, "next_first_id");
    t.sizeLimit = optLong(raw, "size_limit");
    t.liveTail = raw.get("live_tail").asBoolean();
    t.idLo = raw.get("id_lo").asLong();
    t.idHi = optLong(raw, "id_hi");
    t.ids = optSet(raw.get("ids"));
    if (t.ids != null && !t.ids.isEmpty()) {
      t.minId = t.ids.stream().min(Long::compare).get();
      t.maxId = t.ids.stream().max(Long::compare).get();
    }
    t.tsLo = optLong(raw, "ts_lo");
    t.tsHi = optLong(raw, "ts_hi");
    t.seekByTime = raw.get("seek_by_time").asBoolean();
    JsonNode state = raw.get("state");
    if (state != null && !state.isNull()) {
      t.stateHead = state.get("head").asLong();
      t.stateDone = optSet(state.get("done"));
      t.stateLeased = optSet(state.get("leased"));
    }
    t.failfast = raw.get("failfast").asBoolean();
    t.nameId = optLong(raw, "name_id");
    JsonNode columns = raw.get("columns");
    if (columns != null && !columns.isNull()) {
      t.columns = new String[columns.size()];
      for (int i = 0; i < columns.size(); i++) {
        t.columns[i] = columns.get(i).asText();
      }
    }
    JsonNode key = raw.get("encryption_key_hex");
    t.encryptionKeyHex = key == null || key.isNull() ? null : key.asText();
    JsonNode queueId = raw.get("queue_id_hex");
    t.queueIdHex = queueId == null || queueId.isNull() ? null : queueId.asText();
    return t;
  }

  private static Long optLong(JsonNode raw, String name) {
    JsonNode v = raw.get(name);
    return v == null || v.isNull() ? null : v.asLong();
  }

  private static Set<Long> optSet(JsonNode v) {
    if (v == null || v.isNull()) {
      return null;
    }
    Set<Long> out = new HashSet<>();
    for (JsonNode n : v) {
      out.add(n.asLong());
    }
    return out;
  }

  private long nameId() {
    return nameId != null && nameId != 0 ? nameId : firstId;
  }

  /** The segment's log file (named after nameId when the planner found it misnamed). */
  public String logPath() {
    return java.nio.file.Paths.get(path, "segments", String.format("%020d.log", nameId())).toString();
  }

  /** The segment's sparse index file. */
  public String indexPath() {
    return java.nio.file.Paths.get(path, "segments", String.format("%020d.idx", nameId())).toString();
  }
}
