// Kafka's Java producer and consumer (kafka-clients 4.3.1) against one broker, several steps in one
// JVM (a JVM start costs about a second on 2 cores). Compiled and run by the java_kafka fixture.
//
//   java -cp CLASSPATH KafkaChecks BOOTSTRAP PROPS_FILE STEP...
//
// PROPS_FILE ("-" for none) holds client properties added to every client (security.protocol,
// sasl.*, ssl.* for a secured listener). Each STEP is NAME:ARG,ARG,... and prints one line per
// result, tab-separated, that the Python test parses:
//   produce:TOPIC,N,PREFIX[,CODEC]    idempotent producer, N records key PREFIX-i value PREFIX-i,
//                                     compression.type CODEC (none by default)
//                                     -> "sent TOPIC PARTITION OFFSET"
//   txn:TOPIC,TXN_ID                  transactional producer: commits c0 c1, aborts a0 a1, commits c2
//                                     -> "txn committed|aborted N"
//   consume:TOPIC,GROUP,PROTOCOL,ISOLATION,N
//                                     subscribes with group.protocol PROTOCOL (classic|consumer),
//                                     reads N records from the earliest offset, commits them
//                                     -> "record TOPIC PARTITION OFFSET KEY VALUE" per record,
//                                        then "committed GROUP OFFSET" (the committed position)
//   hold:TOPIC,TXN_ID                 transactional producer sends one record, leaves the transaction
//                                     open and prints "open"; the step (and JVM) then waits for
//                                     stdin to close, so a test can look at an ongoing transaction
// Any failure throws: a stack trace and exit status 1.
import java.io.FileReader;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class KafkaChecks {
    private static final Duration WAIT = Duration.ofSeconds(30);
    private final Properties base = new Properties();

    private KafkaChecks(String bootstrap, String propsFile) throws IOException {
        if (!propsFile.equals("-")) {
            try (FileReader in = new FileReader(propsFile)) { base.load(in); }
        }
        base.put("bootstrap.servers", bootstrap);
    }

    public static void main(String[] args) throws Exception {
        KafkaChecks checks = new KafkaChecks(args[0], args[1]);
        for (String step : Arrays.asList(args).subList(2, args.length)) {
            String[] parts = step.split(":", 2);
            String[] a = parts.length > 1 ? parts[1].split(",") : new String[0];
            switch (parts[0]) {
                case "produce" -> checks.produce(a[0], Integer.parseInt(a[1]), a[2],
                                                 a.length > 3 ? a[3] : "none");
                case "txn" -> checks.txn(a[0], a[1]);
                case "consume" -> checks.consume(a[0], a[1], a[2], a[3], Integer.parseInt(a[4]));
                case "hold" -> checks.hold(a[0], a[1]);
                default -> throw new IllegalArgumentException("unknown step " + step);
            }
            System.out.flush();
        }
    }

    private KafkaProducer<String, String> producer(Map<String, String> extra) {
        Properties p = new Properties();
        p.putAll(base);
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("linger.ms", "5");
        p.putAll(extra);
        return new KafkaProducer<>(p, new StringSerializer(), new StringSerializer());
    }

    private void produce(String topic, int n, String prefix, String codec) throws Exception {
        try (KafkaProducer<String, String> p = producer(Map.of("compression.type", codec))) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                sent.add(p.send(new ProducerRecord<>(topic, prefix + "-" + i, prefix + "-" + i)));
            }
            for (var f : sent) {
                RecordMetadata m = f.get();
                System.out.println("sent\t" + m.topic() + "\t" + m.partition() + "\t" + m.offset());
            }
        }
    }

    private void txn(String topic, String txnId) {
        try (KafkaProducer<String, String> p = producer(Map.of("transactional.id", txnId))) {
            p.initTransactions();
            transaction(p, topic, List.of("c0", "c1"), true);
            transaction(p, topic, List.of("a0", "a1"), false);
            transaction(p, topic, List.of("c2"), true);
        }
    }

    private static void transaction(KafkaProducer<String, String> p, String topic, List<String> values,
                                    boolean commit) {
        p.beginTransaction();
        for (String v : values) p.send(new ProducerRecord<>(topic, v, v));
        p.flush();
        if (commit) p.commitTransaction(); else p.abortTransaction();
        System.out.println("txn\t" + (commit ? "committed" : "aborted") + "\t" + values.size());
    }

    private void hold(String topic, String txnId) throws IOException {
        try (KafkaProducer<String, String> p = producer(Map.of("transactional.id", txnId))) {
            p.initTransactions();
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, "open", "open"));
            p.flush();
            System.out.println("open");
            System.out.flush();
            while (System.in.read() != -1) { }
            p.abortTransaction();
        }
    }

    private void consume(String topic, String group, String protocol, String isolation, int n) {
        Properties c = new Properties();
        c.putAll(base);
        c.put("group.id", group);
        c.put("group.protocol", protocol);
        c.put("isolation.level", isolation);
        c.put("auto.offset.reset", "earliest");
        c.put("enable.auto.commit", "false");
        if (protocol.equals("classic")) {       // KIP-848 members take these from the broker
            c.put("session.timeout.ms", "6000");
            c.put("heartbeat.interval.ms", "500");
        }
        try (KafkaConsumer<String, String> consumer =
                 new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer())) {
            consumer.subscribe(List.of(topic));
            List<ConsumerRecord<String, String>> got = new ArrayList<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (got.size() < n) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError("read " + got.size() + " of " + n + " records of " + topic);
                }
                consumer.poll(Duration.ofMillis(100)).forEach(got::add);
            }
            for (ConsumerRecord<String, String> r : got) {
                System.out.println("record\t" + r.topic() + "\t" + r.partition() + "\t" + r.offset()
                                   + "\t" + r.key() + "\t" + r.value());
            }
            consumer.commitSync(WAIT);
            for (TopicPartition tp : consumer.assignment()) {
                OffsetAndMetadata m = consumer.committed(java.util.Set.of(tp), WAIT).get(tp);
                System.out.println("committed\t" + group + "\t" + tp.partition() + "\t"
                                   + (m == null ? -1 : m.offset()));
            }
        }
    }
}
