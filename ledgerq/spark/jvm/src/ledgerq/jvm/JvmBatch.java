package ledgerq.jvm;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import net.razorvine.pickle.Unpickler;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.execution.datasources.v2.python.PythonInputPartition;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Python source's batch plan, read in the JVM. Its partitions carry their task as
 * JSON text (ledgerq/spark/_plan.py task_to_json); a plan the JVM reader cannot serve
 * (the reader turned off, or a task it does not know) is handed back to the Python
 * reader whole, so a query never mixes the two.
 */
public final class JvmBatch implements Batch {
  private static final Logger LOG = LoggerFactory.getLogger("ledgerq");
  private final Batch inner;
  private final StructType schema;
  private final CaseInsensitiveStringMap options;
  private InputPartition[] planned;
  private boolean python;

  JvmBatch(Batch inner, StructType schema, CaseInsensitiveStringMap options) {
    this.inner = inner;
    this.schema = schema;
    this.options = options;
  }

  private synchronized void plan() {
    if (planned != null) {
      return;
    }
    InputPartition[] given = inner.planInputPartitions();
    python = !enabled();
    List<InputPartition> tasks = new ArrayList<>();
    Unpickler unpickler = new Unpickler();
    for (InputPartition p : given) {
      if (python) {
        break;
      }
      Object value = valueOf(unpickler, (PythonInputPartition) p);
      if (value == null) {
        continue; // Spark's stand-in partition of an empty plan
      }
      if (!(value instanceof String text)) {
        python = true; // not a task this reader knows
        break;
      }
      SegmentTask task = SegmentTask.fromJson(text);
      if (task.encryptionKeyHex != null && task.queueIdHex == null) {
        python = true; // a key but no queue identity to open the entries with
        break;
      }
      tasks.add(new JvmPartition(text));
    }
    planned = python ? given : tasks.toArray(new InputPartition[0]);
    LOG.info("ledgerq: {} segments read by the {} reader", planned.length, python ? "Python" : "JVM");
  }

  private boolean enabled() {
    String option = options.get("jvm");
    if (option != null) {
      return !option.trim().equalsIgnoreCase("false");
    }
    scala.Option<SparkSession> session = SparkSession.getActiveSession();
    if (session.isEmpty()) {
      return true;
    }
    return !session.get().conf().get(JvmTable.CONF, "true").trim().equalsIgnoreCase("false");
  }

  private static Object valueOf(Unpickler unpickler, PythonInputPartition partition) {
    try {
      Object unpickled = unpickler.loads(partition.pickedPartition());
      if (unpickled instanceof Map<?, ?> fields) { // a ClassDict: the object's __dict__
        return fields.get("value");
      }
      return unpickled;
    } catch (Exception exc) {
      return new Object(); // not ours to read: the Python reader takes the plan
    }
  }

  /** Whether this plan's segments are read in the JVM (false: by the Python reader). */
  public boolean isReadInJvm() {
    plan();
    return !python;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    plan();
    return planned;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    plan();
    return python ? inner.createReaderFactory() : new JvmReaderFactory(schema);
  }
}

final class JvmPartition implements InputPartition {
  private static final long serialVersionUID = 1L;
  final String task;

  JvmPartition(String task) {
    this.task = task;
  }
}

final class JvmReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;
  private final StructType schema;

  JvmReaderFactory(StructType schema) {
    this.schema = schema;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    return new SegmentRows(SegmentTask.fromJson(((JvmPartition) partition).task), schema);
  }
}
