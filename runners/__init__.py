"""Running things on nodes: transports (local, ssh), fan-out, node-side payloads and tool runners."""
