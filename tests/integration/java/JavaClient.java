// Apache Kafka's Java client (kafka-clients, the version tools/apache-kafka/pom.xml pins), driven
// by the compatibility tests against shmq and against Apache Kafka.  The tests compile this file
// with javac (tools/apache_kafka.py compile_java) and compare what it prints on both brokers.
//
//   produce   BOOTSTRAP TOPIC [k=v...]            stdin: records, stdout: "partition offset" each
//   consume   BOOTSTRAP TOPIC COUNT [k=v...]      assign every partition from the beginning
//   group     BOOTSTRAP TOPIC GROUP COUNT [k=v...] subscribe, read COUNT records, commit, leave
//   producers BOOTSTRAP TOPIC PARTITION           DescribeProducers of a partition
//   admin     BOOTSTRAP TOPIC GROUP               one line per admin call (see admin())
//   txn       BOOTSTRAP TOPIC SOURCE GROUP TID    transactions: commit, abort, admin abort, fencing, offsets (see txn())
//   txnepochs BOOTSTRAP TOPIC SOURCE GROUP TID    the producer epoch after each commit/abort (see txnEpochs())
//
// A record line is tab-separated: partition, offset (or -1 on input), timestamp type, timestamp,
// key, value, headers.  Keys and values are hex ("-" for null); headers are "hexkey:hexvalue"
// joined with "," ("-" for a null value, "" for none).  Settings k=v go to the client's config.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.function.Supplier;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;

import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaClient {
    static final HexFormat HEX = HexFormat.of();

    public static void main(String[] args) throws Exception {
        String cmd = args[0];
        switch (cmd) {
            case "produce" -> produce(args[1], args[2], settings(args, 3));
            case "consume" -> consume(args[1], args[2], Integer.parseInt(args[3]), settings(args, 4));
            case "group" -> group(args[1], args[2], args[3], Integer.parseInt(args[4]), settings(args, 5));
            case "producers" -> producers(args[1], args[2], Integer.parseInt(args[3]));
            case "admin" -> admin(args[1], args[2], args[3]);
            case "txn" -> txn(args[1], args[2], args[3], args[4], args[5]);
            case "txnepochs" -> txnEpochs(args[1], args[2], args[3], args[4], args[5]);
            default -> throw new IllegalArgumentException("unknown command " + cmd);
        }
    }

    static Properties settings(String[] args, int from) {
        Properties p = new Properties();
        for (int i = from; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            p.put(kv[0], kv[1]);
        }
        return p;
    }

    static String hex(byte[] b) {
        return b == null ? "-" : HEX.formatHex(b);
    }

    static byte[] unhex(String s) {
        return s.equals("-") ? null : HEX.parseHex(s);
    }

    static String line(ConsumerRecord<byte[], byte[]> r) {
        List<String> hs = new ArrayList<>();
        for (Header h : r.headers()) {
            hs.add(hex(h.key().getBytes(StandardCharsets.UTF_8)) + ":" + hex(h.value()));
        }
        return r.partition() + "\t" + r.offset() + "\t" + r.timestampType().id + "\t" + r.timestamp()
            + "\t" + hex(r.key()) + "\t" + hex(r.value()) + "\t" + String.join(",", hs);
    }

    // -- produce ----------------------------------------------------------------------------------

    static void produce(String bootstrap, String topic, Properties extra) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.putAll(extra);
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            String l;
            while ((l = in.readLine()) != null) {
                if (l.isEmpty()) continue;
                String[] f = l.split("\t", -1);
                RecordHeaders headers = new RecordHeaders();
                if (!f[6].isEmpty()) {
                    for (String h : f[6].split(",")) {
                        String[] kv = h.split(":", 2);
                        headers.add(new String(unhex(kv[0]), StandardCharsets.UTF_8), unhex(kv[1]));
                    }
                }
                int partition = Integer.parseInt(f[0]);
                long ts = Long.parseLong(f[3]);
                sent.add(producer.send(new ProducerRecord<>(topic, partition < 0 ? null : partition,
                    ts < 0 ? null : ts, unhex(f[4]), unhex(f[5]), headers)));
            }
            producer.flush();
            for (Future<RecordMetadata> f : sent) {
                try {
                    RecordMetadata md = f.get();
                    System.out.println(md.partition() + "\t" + md.offset());
                } catch (ExecutionException e) {
                    System.out.println("error\t" + e.getCause().getClass().getSimpleName());
                }
            }
        }
    }

    // -- consume ----------------------------------------------------------------------------------

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, Properties extra) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    static void consume(String bootstrap, String topic, int count, Properties extra) {
        try (KafkaConsumer<byte[], byte[]> c = consumer(bootstrap, extra)) {
            List<TopicPartition> tps = new ArrayList<>();
            c.partitionsFor(topic, Duration.ofSeconds(30)).forEach(i -> tps.add(new TopicPartition(topic, i.partition())));
            c.assign(tps);
            c.seekToBeginning(tps);
            int n = 0;
            long deadline = System.currentTimeMillis() + 60_000;
            while (n < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println(line(r));
                    n++;
                }
            }
            // a last poll notices records beyond the expected count
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(300))) {
                System.out.println(line(r));
            }
        }
    }

    static void group(String bootstrap, String topic, String group, int count, Properties extra) {
        extra.putIfAbsent(ConsumerConfig.GROUP_ID_CONFIG, group);
        try (KafkaConsumer<byte[], byte[]> c = consumer(bootstrap, extra)) {
            c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> ps) {
                    if (!ps.isEmpty()) System.out.println("revoked\t" + ps.size());
                }
                public void onPartitionsAssigned(Collection<TopicPartition> ps) {
                    System.out.println("assigned\t" + ps.size());
                }
            });
            int n = 0;
            long deadline = System.currentTimeMillis() + 60_000;
            while (n < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println(line(r));
                    n++;
                }
            }
            c.commitSync();
            Map<TopicPartition, OffsetAndMetadata> committed = c.committed(c.assignment());
            new TreeMap<>(toNames(committed)).forEach((tp, om) ->
                System.out.println("committed\t" + tp + "\t" + (om == null ? -1 : om.offset())));
        }
    }

    static Map<String, OffsetAndMetadata> toNames(Map<TopicPartition, OffsetAndMetadata> m) {
        Map<String, OffsetAndMetadata> out = new HashMap<>();
        m.forEach((tp, om) -> out.put(tp.toString(), om));
        return out;
    }

    // -- transactions -----------------------------------------------------------------------------

    static KafkaProducer<byte[], byte[]> txnProducer(String bootstrap, String tid) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, tid);
        return new KafkaProducer<>(p);
    }

    static void send(KafkaProducer<byte[], byte[]> producer, String topic, String prefix, int from, int to)
            throws Exception {
        for (int i = from; i < to; i++) {
            producer.send(new ProducerRecord<>(topic, i % 2, null, (prefix + i).getBytes(StandardCharsets.UTF_8)));
        }
        producer.flush();
    }

    /** Every record of TOPIC's partitions up to the end offsets its isolation level sees (the
     *  last stable offset for read_committed), as "isolation partition offset value" lines. */
    static void readAll(String bootstrap, String topic, String isolation) {
        Properties extra = new Properties();
        extra.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        try (KafkaConsumer<byte[], byte[]> c = consumer(bootstrap, extra)) {
            List<TopicPartition> tps = List.of(new TopicPartition(topic, 0), new TopicPartition(topic, 1));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            List<String> got = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline
                   && tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    got.add(isolation + "\t" + r.partition() + "\t" + r.offset() + "\t"
                        + new String(r.value(), StandardCharsets.UTF_8));
                }
            }
            got.forEach(System.out::println);
            tps.forEach(tp -> System.out.println(isolation + " end\t" + tp.partition() + "\t" + end.get(tp)
                + "\tposition " + c.position(tp)));
        }
    }

    /** A transactional producer commits (with offsets of GROUP on SOURCE-0), aborts (with other
     *  offsets), commits, leaves a transaction open (which the admin client aborts in partition 0,
     *  as kafka-transactions.sh abort does, with WriteTxnMarkers) and is fenced by a second producer of the same
     *  transactional id, which commits; then read_committed and read_uncommitted consumers read
     *  TOPIC, and the group's committed offset and the transaction's state are read back. */
    static void txn(String bootstrap, String topic, String source, String group, String tid) throws Exception {
        ConsumerGroupMetadata groupMetadata = new ConsumerGroupMetadata(group);
        TopicPartition src = new TopicPartition(source, 0);
        KafkaProducer<byte[], byte[]> first = txnProducer(bootstrap, tid);
        step("initTransactions", () -> { first.initTransactions(); return "ok"; });
        step("commit", () -> {
            first.beginTransaction();
            send(first, topic, "c-", 0, 10);
            first.sendOffsetsToTransaction(Map.of(src, new OffsetAndMetadata(5)), groupMetadata);
            first.commitTransaction();
            return "ok";
        });
        step("abort", () -> {
            first.beginTransaction();
            send(first, topic, "a-", 0, 6);
            first.sendOffsetsToTransaction(Map.of(src, new OffsetAndMetadata(9)), groupMetadata);
            first.abortTransaction();
            return "ok";
        });
        step("commit again", () -> {
            first.beginTransaction();
            send(first, topic, "c-", 10, 14);
            first.commitTransaction();
            return "ok";
        });
        step("open", () -> {
            first.beginTransaction();
            send(first, topic, "o-", 0, 4);
            return "ok";
        });
        // kafka-transactions.sh abort --topic --partition ...: WriteTxnMarkers to the leader
        step("abortTransaction", () -> {
            try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
                TopicPartition tp = new TopicPartition(topic, 0);
                ProducerState open = admin.describeProducers(List.of(tp)).partitionResult(tp).get()
                    .activeProducers().stream()
                    .filter(p -> p.currentTransactionStartOffset().isPresent()).findFirst().get();
                admin.abortTransaction(new AbortTransactionSpec(tp, open.producerId(),
                    (short) open.producerEpoch(), open.coordinatorEpoch().orElse(0))).all().get();
                return "ok txnStart=" + open.currentTransactionStartOffset().getAsLong();
            }
        });
        KafkaProducer<byte[], byte[]> second = txnProducer(bootstrap, tid);
        step("second initTransactions", () -> { second.initTransactions(); return "ok"; });
        step("fenced commit", () -> { first.commitTransaction(); return "ok"; });
        first.close(Duration.ofSeconds(5));
        step("second commit", () -> {
            second.beginTransaction();
            send(second, topic, "c-", 14, 16);
            second.sendOffsetsToTransaction(Map.of(src, new OffsetAndMetadata(12)), groupMetadata);
            second.commitTransaction();
            return "ok";
        });
        second.close(Duration.ofSeconds(5));
        readAll(bootstrap, topic, "read_committed");
        readAll(bootstrap, topic, "read_uncommitted");
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            step("listConsumerGroupOffsets", () -> {
                Map<TopicPartition, OffsetAndMetadata> m =
                    admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
                return new TreeMap<>(toNames(m)).toString().replaceAll("leaderEpoch=[^,]*, ", "");
            });
            step("describeTransactions", () -> {
                long deadline = System.currentTimeMillis() + 10_000;
                TransactionDescription d;
                do {  // Kafka answers EndTxn before its markers are written
                    d = admin.describeTransactions(List.of(tid)).description(tid).get();
                } while (!d.state().toString().startsWith("Complete") && System.currentTimeMillis() < deadline
                         && sleep(100));
                return d.state() + " partitions=" + d.topicPartitions().size();
            });
            step("listTransactions", () -> {
                List<String> out = new ArrayList<>();
                for (TransactionListing l : admin.listTransactions().all().get()) {
                    if (l.transactionalId().equals(tid)) out.add(l.transactionalId() + " " + l.state());
                }
                return out.toString();
            });
        }
    }

    /** Transaction version 2 as the client sees it: after initTransactions and after each
     *  commit and abort, the producer epoch the coordinator (DescribeTransactions) and partition
     *  0's leader (DescribeProducers) know, counted from the first; then what read_committed
     *  reads and the group's committed offset. */
    static void txnEpochs(String bootstrap, String topic, String source, String group, String tid)
            throws Exception {
        ConsumerGroupMetadata groupMetadata = new ConsumerGroupMetadata(group);
        TopicPartition src = new TopicPartition(source, 0);
        TopicPartition tp = new TopicPartition(topic, 0);
        int[] first = {-1};
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap));
             KafkaProducer<byte[], byte[]> producer = txnProducer(bootstrap, tid)) {
            Call epochs = () -> {
                TransactionDescription d;
                long deadline = System.currentTimeMillis() + 10_000;
                do {  // Kafka answers EndTxn before its markers are written
                    d = admin.describeTransactions(List.of(tid)).description(tid).get();
                } while (d.state().toString().startsWith("Prepare") && System.currentTimeMillis() < deadline
                         && sleep(50));
                if (first[0] < 0) first[0] = d.producerEpoch();
                List<String> leader = new ArrayList<>();
                for (ProducerState s : admin.describeProducers(List.of(tp)).partitionResult(tp).get().activeProducers()) {
                    leader.add("+" + (s.producerEpoch() - first[0]));
                }
                return d.state() + " coordinator +" + (d.producerEpoch() - first[0]) + " leader " + leader;
            };
            step("initTransactions", () -> { producer.initTransactions(); return epochs.run(); });
            for (int i = 0; i < 3; i++) {
                final int n = i;
                step("commit " + n, () -> {
                    producer.beginTransaction();
                    send(producer, topic, "c" + n + "-", 0, 4);
                    producer.sendOffsetsToTransaction(Map.of(src, new OffsetAndMetadata(n + 1)), groupMetadata);
                    producer.commitTransaction();
                    return epochs.run();
                });
                step("abort " + n, () -> {
                    producer.beginTransaction();
                    send(producer, topic, "a" + n + "-", 0, 2);
                    producer.sendOffsetsToTransaction(Map.of(src, new OffsetAndMetadata(100 + n)), groupMetadata);
                    producer.abortTransaction();
                    return epochs.run();
                });
            }
            step("abort with nothing sent", () -> {
                producer.beginTransaction();
                producer.abortTransaction();
                return epochs.run();
            });
            step("listConsumerGroupOffsets", () -> {
                Map<TopicPartition, OffsetAndMetadata> m =
                    admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
                return new TreeMap<>(toNames(m)).toString().replaceAll("leaderEpoch=[^,]*, ", "");
            });
        }
        readAll(bootstrap, topic, "read_committed");
    }

    static boolean sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return true;
    }

    // -- producers --------------------------------------------------------------------------------

    static void producers(String bootstrap, String topic, int partition) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            TopicPartition tp = new TopicPartition(topic, partition);
            for (ProducerState s : admin.describeProducers(List.of(tp)).partitionResult(tp).get().activeProducers()) {
                System.out.println("producer epoch=" + s.producerEpoch() + " lastSequence=" + s.lastSequence()
                    + " coordinatorEpoch=" + s.coordinatorEpoch() + " txnStart=" + s.currentTransactionStartOffset());
            }
        }
    }

    // -- admin ------------------------------------------------------------------------------------

    interface Call {
        String run() throws Exception;
    }

    /** One admin call per line: "name: result" or "name: error ExceptionClass: message". */
    static void step(String name, Call call) {
        String out;
        try {
            out = call.run();
        } catch (ExecutionException e) {
            out = "error " + e.getCause().getClass().getSimpleName() + ": " + e.getCause().getMessage();
        } catch (Exception e) {
            out = "error " + e.getClass().getSimpleName() + ": " + e.getMessage();
        }
        System.out.println(name + ": " + out);
        System.out.flush();
    }

    /** The topic as describeTopics shows it once it has {@code partitions} partitions: a broker
     * applies a CreatePartitions to its metadata shortly after the call returns (Kafka's
     * brokers learn it from the controller's log), so a describe right after may show the old
     * count. Waits at most 15 s, then returns what it sees. */
    /** The topic once it has {@code partitions} partitions (or after 15 s): a broker may answer
     *  for a topic it created a moment ago before its metadata knows it (Kafka under load
     *  answered UnknownTopicOrPartition right after CreateTopics returned). */
    static TopicDescription awaitPartitions(Admin admin, String topic, int partitions) throws Exception {
        long deadline = System.nanoTime() + 15_000_000_000L;
        while (true) {
            try {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
                if (d.partitions().size() >= partitions || System.nanoTime() > deadline) {
                    return d;
                }
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof UnknownTopicOrPartitionException)
                        || System.nanoTime() > deadline) {
                    throw e;
                }
            }
            Thread.sleep(50);
        }
    }

    static void admin(String bootstrap, String topic, String group) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            step("createTopics", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1)
                    .configs(Map.of("retention.ms", "3600000")))).all().get();
                return "ok";
            });
            step("createTopics again", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
                return "ok";
            });
            step("createTopics bad name", () -> {
                admin.createTopics(List.of(new NewTopic("bad name!", 1, (short) 1))).all().get();
                return "ok";
            });
            step("createTopics bad config", () -> {
                admin.createTopics(List.of(new NewTopic(topic + "-x", 1, (short) 1)
                    .configs(Map.of("retention.ms", "soon")))).all().get();
                return "ok";
            });
            step("createTopics manual assignment", () -> {
                admin.createTopics(List.of(new NewTopic(topic + "-m",
                    Map.of(0, List.of(1), 1, List.of(1))))).all().get();
                TopicDescription d = awaitPartitions(admin, topic + "-m", 2);
                StringBuilder sb = new StringBuilder();
                for (TopicPartitionInfo p : d.partitions()) {
                    sb.append(" p").append(p.partition()).append(":replicas=").append(p.replicas().get(0).id());
                }
                return sb.toString().trim();
            });
            step("createPartitions manual assignment", () -> {
                admin.createPartitions(Map.of(topic + "-m",
                    NewPartitions.increaseTo(3, List.of(List.of(1))))).all().get();
                TopicDescription d = awaitPartitions(admin, topic + "-m", 3);
                return "partitions=" + d.partitions().size() + " p2:replicas="
                    + d.partitions().get(2).replicas().get(0).id();
            });
            step("createTopics manual assignment, unknown broker", () -> {
                admin.createTopics(List.of(new NewTopic(topic + "-u",
                    Map.of(0, List.of(99))))).all().get();
                return "ok";
            });
            Supplier<String> describe = () -> {
                try {
                    TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
                    StringBuilder sb = new StringBuilder("internal=" + d.isInternal());
                    for (TopicPartitionInfo p : d.partitions()) {
                        sb.append(" p").append(p.partition()).append(":leader=").append(p.leader() != null)
                          .append(",replicas=").append(p.replicas().size()).append(",isr=").append(p.isr().size());
                    }
                    return sb.toString();
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            };
            step("describeTopics", describe::get);
            step("listTopics", () -> String.valueOf(admin.listTopics().names().get().contains(topic)));
            step("describeConfigs", () -> {
                Config c = admin.describeConfigs(List.of(res)).all().get().get(res);
                ConfigEntry e = c.get("retention.ms");
                ConfigEntry s = c.get("segment.bytes");
                return "entries=" + c.entries().size() + " retention.ms=" + e.value() + "/" + e.source()
                    + " segment.bytes=" + s.value() + "/" + s.source() + "/" + s.isReadOnly() + "/" + s.type();
            });
            step("incrementalAlterConfigs", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.APPEND))))
                    .all().get();
                Config c = admin.describeConfigs(List.of(res)).all().get().get(res);
                return "retention.ms=" + c.get("retention.ms").value() + " cleanup.policy=" + c.get("cleanup.policy").value();
            });
            step("incrementalAlterConfigs bad value", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "soon"), AlterConfigOp.OpType.SET)))).all().get();
                return "ok";
            });
            step("incrementalAlterConfigs unknown", () -> {
                admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET)))).all().get();
                return "ok";
            });
            step("createPartitions 3", () -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get();
                awaitPartitions(admin, topic, 3);
                return describe.get();
            });
            step("createPartitions 2", () -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(2))).all().get();
                return "ok";
            });
            // ten keyed records (the topic is compacted now) on partition 0, timestamps 1000..1009 ms
            Properties pp = new Properties();
            pp.put("bootstrap.servers", bootstrap);
            pp.put("key.serializer", ByteArraySerializer.class.getName());
            pp.put("value.serializer", ByteArraySerializer.class.getName());
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
                for (int i = 0; i < 10; i++) {
                    producer.send(new ProducerRecord<>(topic, 0, 1000L + i, ("k" + i).getBytes(), ("v" + i).getBytes()));
                }
                producer.flush();
            }
            TopicPartition p0 = new TopicPartition(topic, 0);
            for (Map.Entry<String, OffsetSpec> spec : List.of(
                    Map.entry("earliest", OffsetSpec.earliest()), Map.entry("latest", OffsetSpec.latest()),
                    Map.entry("maxTimestamp", OffsetSpec.maxTimestamp()),
                    Map.entry("forTimestamp 1004", OffsetSpec.forTimestamp(1004)),
                    Map.entry("forTimestamp 5000", OffsetSpec.forTimestamp(5000)))) {
                step("listOffsets " + spec.getKey(), () -> {
                    ListOffsetsResult.ListOffsetsResultInfo i = admin.listOffsets(Map.of(p0, spec.getValue())).all().get().get(p0);
                    return "offset=" + i.offset() + " timestamp=" + i.timestamp();
                });
            }
            step("deleteRecords 4", () -> "lowWatermark=" + admin.deleteRecords(Map.of(p0, RecordsToDelete.beforeOffset(4)))
                .lowWatermarks().get(p0).get().lowWatermark());
            step("deleteRecords 99", () -> "lowWatermark=" + admin.deleteRecords(Map.of(p0, RecordsToDelete.beforeOffset(99)))
                .lowWatermarks().get(p0).get().lowWatermark());
            step("listOffsets earliest after delete", () -> "offset=" + admin.listOffsets(Map.of(p0, OffsetSpec.earliest()))
                .all().get().get(p0).offset());
            step("describeCluster", () -> {
                DescribeClusterResult r = admin.describeCluster();
                return "nodes>0=" + !r.nodes().get().isEmpty() + " controller=" + (r.controller().get() != null)
                    + " clusterId=" + (r.clusterId().get() != null);
            });
            step("alterConsumerGroupOffsets", () -> {
                admin.alterConsumerGroupOffsets(group, Map.of(p0, new OffsetAndMetadata(7, "meta"))).all().get();
                return "ok";
            });
            step("listConsumerGroupOffsets", () -> {
                Map<TopicPartition, OffsetAndMetadata> m = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
                return m.toString().replaceAll("leaderEpoch=Optional\\[\\d+\\]", "leaderEpoch=E");
            });
            step("listGroups", () -> {
                for (ConsumerGroupListing l : admin.listConsumerGroups().all().get()) {
                    if (l.groupId().equals(group)) return "state=" + l.groupState().orElse(null) + " type=" + l.type().orElse(null);
                }
                return "missing";
            });
            step("describeConsumerGroups", () -> {
                ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
                return "state=" + d.groupState() + " members=" + d.members().size() + " simple=" + d.isSimpleConsumerGroup()
                    + " type=" + d.type() + " assignor=" + d.partitionAssignor();
            });
            step("deleteConsumerGroupOffsets", () -> {
                admin.deleteConsumerGroupOffsets(group, Set.of(p0)).all().get();
                return String.valueOf(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get());
            });
            step("deleteConsumerGroups", () -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                return "ok";
            });
            step("deleteConsumerGroups unknown", () -> {
                admin.deleteConsumerGroups(List.of(group + "-none")).all().get();
                return "ok";
            });
            step("deleteTopics", () -> {
                admin.deleteTopics(List.of(topic)).all().get();
                return "ok";
            });
            step("deleteTopics unknown", () -> {
                admin.deleteTopics(List.of(topic + "-none")).all().get();
                return "ok";
            });
        }
    }
}
