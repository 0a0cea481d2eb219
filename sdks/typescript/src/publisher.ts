/** Publish signed completion events with an idempotent producer (acks=all). */
import { Kafka, Partitioners, type KafkaConfig, type Producer, type ProducerConfig } from "kafkajs";

import type { CompletionEvent } from "./event.js";
import { encode } from "./event.js";
import { SigningKey, signRecord } from "./signing.js";

export interface PublisherOptions {
  /** `host:port[,host:port...]` or a list. */
  bootstrapServers: string | string[];
  /** The events topic (`MATCHER_EVENTS_TOPIC`). */
  topic: string;
  /** The producer's key or keys (several while rotating); none: unsigned (development only). */
  keys?: SigningKey | readonly SigningKey[];
  /** Structured mode: the whole CloudEvent as the value. Binary mode (ce_ headers) otherwise. */
  structured?: boolean;
  /** More kafkajs client options (ssl, sasl, clientId, logLevel...). */
  kafka?: Omit<KafkaConfig, "brokers">;
  /** More kafkajs producer options. */
  producer?: ProducerConfig;
}

/**
 * The events are keyed `tenant\x1fcorrelationId`, and partitioned by kafkajs's
 * DefaultPartitioner: murmur2, the same partition as the Java client and matcher's own
 * producers would pick (`matcher explain` shows it as `murmur2`).
 */
export class EventPublisher {
  private readonly producer: Producer;
  private readonly keys: readonly SigningKey[];
  private connected = false;

  constructor(private readonly options: PublisherOptions) {
    const brokers = Array.isArray(options.bootstrapServers)
      ? options.bootstrapServers
      : options.bootstrapServers.split(",").map((s) => s.trim()).filter(Boolean);
    const kafka = new Kafka({ clientId: "matcher-producer", ...options.kafka, brokers });
    this.producer = kafka.producer({
      createPartitioner: Partitioners.DefaultPartitioner,
      idempotent: true,
      maxInFlightRequests: 1,
      ...options.producer,
    });
    this.keys = options.keys instanceof SigningKey ? [options.keys] : [...(options.keys ?? [])];
  }

  async connect(): Promise<void> {
    await this.producer.connect();
    this.connected = true;
  }

  async disconnect(): Promise<void> {
    if (this.connected) await this.producer.disconnect();
    this.connected = false;
  }

  /** Sends one event and resolves once Kafka has it (all in-sync replicas). */
  async publish(event: CompletionEvent): Promise<void> {
    let record = encode(event, { structured: this.options.structured ?? false });
    if (this.keys.length > 0) record = signRecord(record, event.id, this.keys);
    await this.producer.send({
      topic: this.options.topic,
      acks: -1,
      messages: [
        {
          key: record.key,
          value: record.value,
          headers: Object.fromEntries(record.headers.map(([name, value]) => [name, value])),
        },
      ],
    });
  }
}
