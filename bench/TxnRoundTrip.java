// Sequential transaction round trips with the Java client, timed exactly like
// bench_client.py's txn loop: open, send 1 message in the txn (sync), receive 1
// message and ack it in the txn (waiting for the ack response), commit (waiting).
//
// Run (Java 11+ single-file source launcher; bench_client.py does this):
//   java -cp '<pulsar-home>/lib/*' bench/TxnRoundTrip.java URL IN_TOPIC OUT_TOPIC WARMUP ITERATIONS SIZE
// Prints one "rt total open send ack commit" line per measured iteration (microseconds).

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.client.api.transaction.Transaction;

public class TxnRoundTrip {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String in = args[1];
        String out = args[2];
        int warmup = Integer.parseInt(args[3]);
        int iterations = Integer.parseInt(args[4]);
        byte[] payload = new byte[Integer.parseInt(args[5])];
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).enableTransaction(true).build()) {
            Consumer<byte[]> consumer = client.newConsumer()
                    .topic(in)
                    .subscriptionName("java-rt")
                    .subscriptionType(SubscriptionType.Shared)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .subscribe();
            Producer<byte[]> producer = client.newProducer()
                    .topic(out)
                    .sendTimeout(0, TimeUnit.SECONDS)
                    .create();
            StringBuilder sb = new StringBuilder();
            for (int i = 0; i < warmup + iterations; i++) {
                long t0 = System.nanoTime();
                Transaction txn = client.newTransaction()
                        .withTransactionTimeout(60, TimeUnit.SECONDS).build().get();
                long t1 = System.nanoTime();
                producer.newMessage(txn).value(payload).send();
                long t2 = System.nanoTime();
                Message<byte[]> msg = consumer.receive();
                consumer.acknowledgeAsync(msg.getMessageId(), txn).get();
                long t3 = System.nanoTime();
                txn.commit().get();
                long t4 = System.nanoTime();
                if (i >= warmup) {
                    sb.append("rt ").append((t4 - t0) / 1000).append(' ').append((t1 - t0) / 1000)
                            .append(' ').append((t2 - t1) / 1000).append(' ').append((t3 - t2) / 1000)
                            .append(' ').append((t4 - t3) / 1000).append('\n');
                }
            }
            System.out.print(sb);
            System.out.flush();
            producer.close();
            consumer.close();
        }
    }
}
