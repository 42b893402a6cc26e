package metricslake.spark;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;

import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The lake's Spark session extensions ({@code spark.sql.extensions}) for {@code lake sql-server}: the row scope
 * of read tokens limited to some servers ({@link LakeRowScope}).
 */
public final class LakeExtensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectPostHocResolutionRule(new AbstractFunction1<SparkSession, Rule<LogicalPlan>>() {
            @Override
            public Rule<LogicalPlan> apply(SparkSession session) {
                return new LakeRowScope();
            }
        });
        return BoxedUnit.UNIT;
    }
}
