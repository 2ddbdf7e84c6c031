package ledgerq.jvm;

import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.metric.CustomTaskMetric;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.streaming.ContinuousStream;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.internal.connector.SupportsMetadata;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The Python source's table, whose batch scans read in the JVM (see DefaultSource). */
public final class JvmTable implements Table, SupportsRead, SupportsWrite {
  /** Session conf that turns the JVM reader off ("false"): every read is the Python one. */
  public static final String CONF = "spark.ledgerq.jvmReader";

  private final Table inner;

  public JvmTable(Table inner) {
    this.inner = inner;
  }

  @Override
  public String name() {
    return inner.name();
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return inner.schema();
  }

  @Override
  public Column[] columns() {
    return inner.columns();
  }

  @Override
  public Transform[] partitioning() {
    return inner.partitioning();
  }

  @Override
  public Map<String, String> properties() {
    return inner.properties();
  }

  @Override
  public Set<TableCapability> capabilities() {
    return inner.capabilities();
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new JvmScanBuilder(((SupportsRead) inner).newScanBuilder(options), options);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    return ((SupportsWrite) inner).newWriteBuilder(info);
  }
}

final class JvmScanBuilder implements ScanBuilder, SupportsPushDownFilters {
  private final ScanBuilder inner;
  private final CaseInsensitiveStringMap options;

  JvmScanBuilder(ScanBuilder inner, CaseInsensitiveStringMap options) {
    this.inner = inner;
    this.options = options;
  }

  @Override
  public Filter[] pushFilters(Filter[] filters) {
    return inner instanceof SupportsPushDownFilters p ? p.pushFilters(filters) : filters;
  }

  @Override
  public Filter[] pushedFilters() {
    return inner instanceof SupportsPushDownFilters p ? p.pushedFilters() : new Filter[0];
  }

  @Override
  public Scan build() {
    return new JvmScan(inner.build(), options);
  }
}

final class JvmScan implements Scan, SupportsMetadata {
  private final Scan inner;
  private final CaseInsensitiveStringMap options;

  JvmScan(Scan inner, CaseInsensitiveStringMap options) {
    this.inner = inner;
    this.options = options;
  }

  @Override
  public StructType readSchema() {
    return inner.readSchema();
  }

  @Override
  public String description() {
    return inner.description();
  }

  @Override
  public Batch toBatch() {
    return new JvmBatch(inner.toBatch(), readSchema(), options);
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return inner.toMicroBatchStream(checkpointLocation);
  }

  @Override
  public ContinuousStream toContinuousStream(String checkpointLocation) {
    return inner.toContinuousStream(checkpointLocation);
  }

  @Override
  public CustomMetric[] supportedCustomMetrics() {
    return inner.supportedCustomMetrics();
  }

  @Override
  public CustomTaskMetric[] reportDriverMetrics() {
    return inner.reportDriverMetrics();
  }

  @Override
  public scala.collection.immutable.Map<String, String> getMetaData() {
    if (inner instanceof SupportsMetadata m) {
      return m.getMetaData();
    }
    return scala.collection.immutable.Map$.MODULE$.empty();
  }
}
