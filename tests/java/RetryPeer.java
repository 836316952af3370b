// The Java client's side of tests/test_retry_letter.py: one retry-enabled Shared consumer that
// takes one message, prints what it got, then either reconsumes it later or acknowledges it.
//
// Args: SERVICE_URL TOPIC SUBSCRIPTION MODE MAX_REDELIVER_COUNT DELAY_MS
//   MODE "reconsume": reconsumeLater(message, {"c": "java"}, DELAY_MS ms); "ack": acknowledge.
// Output, one fact a line: "topic T", "id ID", "data D", "key K", then "prop NAME=VALUE" sorted by name.

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

public class RetryPeer {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        String mode = args[3];
        int max = Integer.parseInt(args[4]);
        long delayMs = Long.parseLong(args[5]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            Consumer<byte[]> consumer = client.newConsumer()
                    .topic(topic)
                    .subscriptionName(subscription)
                    .subscriptionType(SubscriptionType.Shared)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .enableRetry(true)
                    .deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(max).build())
                    .subscribe();
            Message<byte[]> got = consumer.receive(30, TimeUnit.SECONDS);
            if (got == null) {
                System.out.println("none");
                System.exit(2);
            }
            System.out.println("topic " + got.getTopicName());
            System.out.println("id " + got.getMessageId());
            System.out.println("data " + new String(got.getData(), StandardCharsets.UTF_8));
            System.out.println("key " + got.getKey());
            new TreeMap<>(got.getProperties()).forEach((k, v) -> System.out.println("prop " + k + "=" + v));
            if (mode.equals("reconsume")) {
                consumer.reconsumeLater(got, Map.of("c", "java"), delayMs, TimeUnit.MILLISECONDS);
            } else {
                consumer.acknowledge(got);
            }
            consumer.close();
        }
    }
}
