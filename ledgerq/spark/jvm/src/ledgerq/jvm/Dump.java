package ledgerq.jvm;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.StructType;

/**
 * The JVM reader without Spark, for the tests: reads tasks (the JSON text of
 * ledgerq/spark/_plan.py task_to_json), one per line on stdin, and prints for each one
 * line: {"rows": [[id, timestamp_us, expires_at_us, priority, {headers}, payload_hex,
 * deliver_at_us], ...], "corrupt_regions": n, "corrupt_bytes": n, "lost_messages": n},
 * or {"error": message} when the read fails (FAILFAST).
 */
public final class Dump {
  private Dump() {}

  private static final String SCHEMA =
      "id long, timestamp long, expires_at long, priority int, headers map<string,string>, payload binary,"
          + " deliver_at long";

  public static void main(String[] args) throws Exception {
    ObjectMapper json = new ObjectMapper();
    StructType schema = StructType.fromDDL(SCHEMA);
    PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    HexFormat hex = HexFormat.of();
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isBlank()) {
        continue;
      }
      ObjectNode result = json.createObjectNode();
      ArrayNode rows = result.putArray("rows");
      SegmentRows reader = new SegmentRows(SegmentTask.fromJson(line), schema);
      try {
        SegmentRows.forEach(reader, r -> {
          ArrayNode row = rows.addArray();
          row.add(r.getLong(0));
          row.add(r.getLong(1));
          if (r.isNullAt(2)) {
            row.addNull();
          } else {
            row.add(r.getLong(2));
          }
          row.add(r.getInt(3));
          ObjectNode headers = row.addObject();
          MapData map = r.getMap(4);
          for (int i = 0; i < map.numElements(); i++) {
            headers.put(map.keyArray().getUTF8String(i).toString(), map.valueArray().getUTF8String(i).toString());
          }
          row.add(hex.formatHex(r.getBinary(5)));
          if (r.isNullAt(6)) {
            row.addNull();
          } else {
            row.add(r.getLong(6));
          }
        });
        result.put("corrupt_regions", reader.corruptRegions);
        result.put("corrupt_bytes", reader.corruptBytes);
        result.put("lost_messages", reader.lostMessages);
      } catch (RuntimeException exc) {
        result.removeAll();
        result.put("error", String.valueOf(exc.getMessage()));
      }
      out.println(json.writeValueAsString(result));
    }
    out.flush();
  }
}
