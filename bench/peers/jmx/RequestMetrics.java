// The broker's own timing of each Produce request, read over JMX: one JSON object per
// line, {"name": ..., "count": ..., "mean": ...}, for each stage
// of kafka.network:type=RequestMetrics,request=Produce (queue, local append, waiting for
// the replicas, response queue, response send, total). Run as a single-file program:
//
//     java bench/peers/jmx/RequestMetrics.java <JMX service URL>
//
// bench/peers/measure.py gets the URL from the broker's local management agent.
import java.util.TreeSet;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class RequestMetrics {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: java RequestMetrics.java <JMX service URL>");
            System.exit(2);
        }
        try (JMXConnector connector = JMXConnectorFactory.connect(new JMXServiceURL(args[0]))) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            ObjectName pattern =
                    new ObjectName("kafka.network:type=RequestMetrics,request=Produce,name=*");
            for (ObjectName name : new TreeSet<>(server.queryNames(pattern, null))) {
                if (!name.getKeyPropertyList().keySet().equals(
                        java.util.Set.of("type", "request", "name"))) {
                    continue;  // per-version or per-error variants
                }
                Object count = server.getAttribute(name, "Count");
                Object mean = server.getAttribute(name, "Mean");
                System.out.printf(
                        "{\"name\": \"%s\", \"count\": %s, \"mean\": %s}%n",
                        name.getKeyProperty("name"), count, mean);
            }
        }
    }
}
