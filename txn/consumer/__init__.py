"""Consumers: subscriptions, flow permits, batch parsing, grouped acks, transactional acks,
negative acks, redelivery and reconnects.

The package, split the way aiokafka splits its consumer (one module per concern):

- :mod:`.config`: :class:`ConsumerType`, :class:`InitialPosition`, :class:`ConsumerConfig`;
- :mod:`.flow`: flow permits and decoding (MESSAGE frames to messages, corrupt entries);
- :mod:`.acks`: acknowledgements (grouped, batch-index, transactional, negative) and redelivery;
- :mod:`.parent`: :class:`ConsumerParent`, what those parts use of the face (a Protocol);
- :mod:`.topic_consumer`: :class:`TopicConsumer`, one topic or partition (subscribe, resubscribe,
  close), assembled from the flow and the ack tracker;
- :mod:`.async_consumer`: :class:`AsyncConsumer`, the public face over all of them.

Every name is re-exported here, so ``from txn.consumer import ...`` works as before.
"""

from .acks import TXN_ACK_CHUNK, AckTracker, _ack_set_words, _split_by_entry, _txn_ack_ids
from .async_consumer import AsyncConsumer
from .config import ConsumerConfig, ConsumerType, InitialPosition, RegexSubscriptionMode
from .flow import MessageFlow, T, _is_acked, log
from .parent import ConsumerParent
from .topic_consumer import TopicConsumer

__all__ = [
    "TXN_ACK_CHUNK",
    "AckTracker",
    "AsyncConsumer",
    "ConsumerConfig",
    "ConsumerParent",
    "ConsumerType",
    "InitialPosition",
    "RegexSubscriptionMode",
    "MessageFlow",
    "T",
    "TopicConsumer",
    "_ack_set_words",
    "_is_acked",
    "_split_by_entry",
    "_txn_ack_ids",
    "log",
]
