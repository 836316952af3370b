// The Java client's side of tests/test_schema_java.py: runs the jobs read from stdin (a JSON list)
// in order, with one client, and prints one line "RESULT <json>" per result (the client logs to
// stdout too).
//
// Args: SERVICE_URL
// A job: {"op": "consume", "topic": T, "kind": "avro"|"json"|"string", "count": N}
//   subscribes ("java", earliest) with Schema.AUTO_CONSUME() (Schema.STRING for "string"), takes N
//   messages, acknowledges each and prints {"job": I, "id": ID, "value": V, "version": HEX} per
//   message: V is the GenericRecord's fields as plain JSON (an Avro record's walked by its schema,
//   bytes as latin-1 text; a JSON record's node as read).
// A job: {"op": "produce", "topic": T, "kind": K, "definition": D, "values": [V, ...], "batch": B}
//   creates a producer with Schema.generic of a SchemaInfo holding D (Schema.STRING for "string"),
//   sends each V (an Avro record built from V by the definition, bytes from latin-1 text; a JSON
//   record holding V), all in one batch if B, and prints {"job": I, "sent": ID}; a refused
//   producer prints {"job": I, "error": EXCEPTION_CLASS}.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericEnumSymbol;
import org.apache.avro.generic.IndexedRecord;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.ProducerBuilder;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.schema.GenericRecord;
import org.apache.pulsar.client.api.schema.GenericSchema;
import org.apache.pulsar.client.impl.schema.generic.GenericAvroRecord;
import org.apache.pulsar.client.impl.schema.generic.GenericJsonRecord;
import org.apache.pulsar.common.schema.SchemaInfo;
import org.apache.pulsar.common.schema.SchemaType;

public class SchemaPeer {
    static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        JsonNode jobs = JSON.readTree(System.in);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(args[0]).build()) {
            for (int i = 0; i < jobs.size(); i++) {
                JsonNode job = jobs.get(i);
                if (job.get("op").asText().equals("consume")) {
                    consume(client, i, job);
                } else {
                    produce(client, i, job);
                }
            }
        }
    }

    static void print(int job, Object... pairs) throws Exception {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("job", job);
        for (int k = 0; k < pairs.length; k += 2) {
            line.put((String) pairs[k], pairs[k + 1]);
        }
        System.out.println("RESULT " + JSON.writeValueAsString(line));
    }

    static void consume(PulsarClient client, int i, JsonNode job) throws Exception {
        String kind = job.get("kind").asText();
        Schema<?> schema = kind.equals("string") ? Schema.STRING : Schema.AUTO_CONSUME();
        try (Consumer<?> consumer = client.newConsumer(schema).topic(job.get("topic").asText())
                .subscriptionName("java").subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe()) {
            for (int n = 0; n < job.get("count").asInt(); n++) {
                Message<?> m = consumer.receive(20, TimeUnit.SECONDS);
                if (m == null) {
                    print(i, "error", "timeout");
                    return;
                }
                byte[] version = m.getSchemaVersion();
                print(i, "id", m.getMessageId().toString(), "value", plain(m.getValue()), "version",
                        version == null ? null : HexFormat.of().formatHex(version));
                consumer.acknowledge(m);
            }
        }
    }

    // A decoded value as what Jackson writes as plain JSON.
    static Object plain(Object v) {
        if (v instanceof GenericJsonRecord r) {
            return r.getJsonNode();
        }
        if (v instanceof GenericAvroRecord r) {
            return plain(r.getAvroRecord());
        }
        if (v instanceof IndexedRecord r) {
            Map<String, Object> out = new LinkedHashMap<>();
            for (org.apache.avro.Schema.Field f : r.getSchema().getFields()) {
                out.put(f.name(), plain(r.get(f.pos())));
            }
            return out;
        }
        if (v instanceof ByteBuffer b) {
            byte[] bytes = new byte[b.remaining()];
            b.duplicate().get(bytes);
            return new String(bytes, StandardCharsets.ISO_8859_1);
        }
        if (v instanceof CharSequence || v instanceof GenericEnumSymbol) {
            return v.toString();
        }
        if (v instanceof Map<?, ?> map) {
            Map<String, Object> out = new LinkedHashMap<>();
            map.forEach((k, x) -> out.put(k.toString(), plain(x)));
            return out;
        }
        if (v instanceof Collection<?> items) {
            List<Object> out = new ArrayList<>();
            items.forEach(x -> out.add(plain(x)));
            return out;
        }
        return v;
    }

    static void produce(PulsarClient client, int i, JsonNode job) throws Exception {
        String kind = job.get("kind").asText();
        if (kind.equals("string")) {
            List<String> values = new ArrayList<>();
            job.get("values").forEach(v -> values.add(v.asText()));
            send(client.newProducer(Schema.STRING), i, job, values);
            return;
        }
        byte[] definition = JSON.writeValueAsBytes(job.get("definition"));
        SchemaInfo info = SchemaInfo.builder().name(kind.toUpperCase()).schema(definition)
                .type(kind.equals("avro") ? SchemaType.AVRO : SchemaType.JSON).properties(Map.of()).build();
        GenericSchema<GenericRecord> schema = Schema.generic(info);
        org.apache.avro.Schema avro = new org.apache.avro.Schema.Parser().parse(new String(definition,
                StandardCharsets.UTF_8));
        List<GenericRecord> records = new ArrayList<>();
        for (JsonNode v : job.get("values")) {
            records.add(kind.equals("avro")
                    ? new GenericAvroRecord(null, avro, schema.getFields(),
                            (org.apache.avro.generic.GenericRecord) avroValue(avro, v))
                    : new GenericJsonRecord(null, schema.getFields(), v, info));
        }
        send(client.newProducer(schema), i, job, records);
    }

    // Send the values (in one batch if the job says "batch") and print their ids, or the refusal.
    static <T> void send(ProducerBuilder<T> builder, int i, JsonNode job, List<T> values) throws Exception {
        boolean batch = job.path("batch").asBoolean(false);
        Producer<T> producer;
        try {
            producer = builder.topic(job.get("topic").asText()).enableBatching(batch)
                    .batchingMaxPublishDelay(10, TimeUnit.SECONDS).batchingMaxMessages(Math.max(1, values.size()))
                    .create();
        } catch (PulsarClientException e) {
            print(i, "error", e.getClass().getSimpleName());
            return;
        }
        List<CompletableFuture<MessageId>> sent = new ArrayList<>();
        for (T v : values) {
            sent.add(producer.sendAsync(v));
        }
        producer.flush();
        for (CompletableFuture<MessageId> id : sent) {
            print(i, "sent", id.get().toString());
        }
        producer.close();
    }

    // A plain JSON value as the Avro generic datum of schema s.
    static Object avroValue(org.apache.avro.Schema s, JsonNode v) {
        switch (s.getType()) {
            case UNION:
                if (v == null || v.isNull()) {
                    return null;
                }
                for (org.apache.avro.Schema branch : s.getTypes()) {
                    if (branch.getType() != org.apache.avro.Schema.Type.NULL) {
                        return avroValue(branch, v);
                    }
                }
                throw new IllegalArgumentException("no branch for " + v);
            case RECORD:
                GenericData.Record r = new GenericData.Record(s);
                for (org.apache.avro.Schema.Field f : s.getFields()) {
                    r.put(f.pos(), avroValue(f.schema(), v.get(f.name())));
                }
                return r;
            case ENUM:
                return new GenericData.EnumSymbol(s, v.asText());
            case ARRAY:
                List<Object> items = new ArrayList<>();
                v.forEach(x -> items.add(avroValue(s.getElementType(), x)));
                return items;
            case MAP:
                Map<String, Object> map = new LinkedHashMap<>();
                Iterator<Map.Entry<String, JsonNode>> it = v.fields();
                while (it.hasNext()) {
                    Map.Entry<String, JsonNode> e = it.next();
                    map.put(e.getKey(), avroValue(s.getValueType(), e.getValue()));
                }
                return map;
            case STRING:
                return v.asText();
            case INT:
                return v.asInt();
            case LONG:
                return v.asLong();
            case FLOAT:
                return (float) v.asDouble();
            case DOUBLE:
                return v.asDouble();
            case BOOLEAN:
                return v.asBoolean();
            case BYTES:
                return ByteBuffer.wrap(v.asText().getBytes(StandardCharsets.ISO_8859_1));
            case NULL:
                return null;
            default:
                throw new IllegalArgumentException("unsupported " + s.getType());
        }
    }
}
