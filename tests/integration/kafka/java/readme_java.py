'''The README's Java, Kafka CLI tools and Spark connector examples (for its "Kafka clients"
section), as written: test_readme_java.py runs them, in this order, against one broker with its
address for 127.0.0.1:9092, from a directory where ``tests/`` is the repository's; the SASL_SSL
ones against a SASL_SSL broker with its address for 127.0.0.1:9093. Kept here until the README
carries them (then the test reads README.md, as test_readme_examples does).'''

ADDRESS = "127.0.0.1:9092"

# Fetch Kafka's jars (clients and tools) and Spark's connector once, from the repository's root.
FETCH = """\
mvn -q -f tests/java/kafka/pom.xml \\
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \\
    -DoutputDirectory="$PWD/libs"
mvn -q -f tests/java/spark/pom.xml \\
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \\
    -DoutputDirectory="$PWD/spark-libs" \\
    -DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2
"""

# Deliveries.java, run with `java -cp 'libs/*' Deliveries.java` (Java 17's single-file launch).
JAVA = """\
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Deliveries {
    public static void main(String[] args) {
        Properties p = new Properties();
        p.put("bootstrap.servers", "127.0.0.1:9092");
        p.put("transactional.id", "deliveries-app");
        try (var producer = new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            producer.initTransactions();
            producer.beginTransaction();
            producer.send(new ProducerRecord<>("deliveries", "order-1", "shipped"));
            producer.commitTransaction();
        }
        Properties c = new Properties();
        c.put("bootstrap.servers", "127.0.0.1:9092");
        c.put("group.id", "couriers");
        c.put("group.protocol", "consumer");
        c.put("isolation.level", "read_committed");
        c.put("auto.offset.reset", "earliest");
        try (var consumer = new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of("deliveries"));
            var records = consumer.poll(Duration.ofSeconds(1));
            while (records.isEmpty()) records = consumer.poll(Duration.ofSeconds(1));
            for (var r : records) {
                System.out.println(r.topic() + " " + r.partition() + " " + r.offset() + " "
                                   + r.key() + " " + r.value());
            }
            consumer.commitSync();
        }
    }
}
"""
JAVA_RUN = "java -cp 'libs/*' Deliveries.java"
JAVA_PRINTS = "deliveries 0 0 order-1 shipped\n"

TOOLS = """\
export CLASSPATH="$PWD/libs/*"
tools="java org.apache.kafka.tools"
$tools.TopicCommand --bootstrap-server 127.0.0.1:9092 --create --topic audit --partitions 1
echo 'user-1:login' | $tools.ConsoleProducer --bootstrap-server 127.0.0.1:9092 --topic audit \\
    --reader-property parse.key=true --reader-property key.separator=:
$tools.consumer.ConsoleConsumer --bootstrap-server 127.0.0.1:9092 --topic audit \\
    --from-beginning --max-messages 1 --group auditors --formatter-property print.key=true
$tools.consumer.group.ConsumerGroupCommand --bootstrap-server 127.0.0.1:9092 \\
    --describe --group auditors
$tools.GetOffsetShell --bootstrap-server 127.0.0.1:9092 --topic audit
"""
TOOLS_PRINTS = ["user-1\tlogin", "audit:0:1"]    # and the group's table: offset 1, lag 0

SPARK = """\
import glob

from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[1]")
         .config("spark.jars", ",".join(glob.glob("spark-libs/*.jar")))
         .getOrCreate())
kafka = {"kafka.bootstrap.servers": "127.0.0.1:9092"}
deliveries = spark.read.format("kafka").options(**kafka).option("subscribe", "deliveries").load()
(deliveries.selectExpr("key", "upper(CAST(value AS STRING)) AS value")
 .write.format("kafka").options(**kafka).option("topic", "deliveries-upper").save())
upper = spark.read.format("kafka").options(**kafka).option("subscribe", "deliveries-upper").load()
for row in upper.selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v").collect():
    print(row.k, row.v)
spark.stop()
"""
SPARK_PRINTS = "order-1 SHIPPED\n"

# Over SASL_SSL: a broker with kafka_listeners = ["SASL_SSL://127.0.0.1:9093"] and the TLS
# subsection's certificate (ca.pem its CA, in the current directory); libs/ as fetched above.
SASL_SSL_ADDRESS = "127.0.0.1:9093"
SASL_SSL = """\
printf 'alice-secret\\n' | mq users add alice
mq topics create logins
mq acls add --allow-principal User:alice --operation Read --operation Write --topic logins
mq acls add --allow-principal User:alice --operation Read --group login-auditors
cat > alice.properties <<'EOF'
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-256
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="alice-secret";
ssl.truststore.type=PEM
ssl.truststore.location=ca.pem
EOF
export CLASSPATH="$PWD/libs/*"
tools="java org.apache.kafka.tools"
echo login | $tools.ConsoleProducer --bootstrap-server 127.0.0.1:9093 \\
    --command-config alice.properties --topic logins
$tools.consumer.ConsoleConsumer --bootstrap-server 127.0.0.1:9093 \\
    --command-config alice.properties --topic logins --from-beginning --max-messages 1 \\
    --group login-auditors
"""
SASL_SSL_PRINTS = "login"

# Spark's connector takes the same properties as options prefixed with "kafka.".
SPARK_SASL_SSL = """\
kafka = {"kafka.bootstrap.servers": "127.0.0.1:9093",
         "kafka.security.protocol": "SASL_SSL",
         "kafka.sasl.mechanism": "SCRAM-SHA-256",
         "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule"
                                   ' required username="alice" password="alice-secret";',
         "kafka.ssl.truststore.type": "PEM",
         "kafka.ssl.truststore.location": "ca.pem"}
"""
