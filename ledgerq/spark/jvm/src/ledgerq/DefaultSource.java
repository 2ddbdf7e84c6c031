package ledgerq;

import java.util.Map;

import ledgerq.jvm.JvmTable;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;

/**
 * {@code format("ledgerq")} when this jar is on the classpath: the Python data source
 * (registered under the same name) for everything, except that batch reads run their
 * tasks in the JVM.
 *
 * <p>Spark looks a format up as a Java class ({@code ledgerq.DefaultSource}) before it
 * looks for a registered Python data source, and a Python source's provider is a
 * {@link PythonDataSourceV2} that Spark gives the format's name. This class is that
 * provider, with one change: its table's batch scan plans through the Python source
 * (so the plan - segments, filters, keys, reader state - is made in one place) and
 * reads the planned segments in the JVM. Writes and streams are the Python source's,
 * untouched.
 */
public class DefaultSource extends PythonDataSourceV2 {
  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new JvmTable(super.getTable(schema, partitioning, properties));
  }
}
