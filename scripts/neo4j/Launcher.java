// A real Neo4j 5.26 Community server for the test suite, built from Maven Central jars.
//
// Why embedded: no Neo4j tarball or apt repository is reachable from CI/dev machines here, but the
// jars are, and the embedded DatabaseManagementService can open the same Bolt connector a packaged
// server opens, so the Python driver talks to it exactly as to production (auth included).
//
// Run in source-file mode (no javac step), normally through scripts/neo4j-server:
//   java -Xmx512m <add-opens flags> -cp '<lib>/*' Launcher.java <home> <port> <password-file> [pagecache]
//
// The password is read from a file (mode 0600, created by scripts/neo4j-server) so it never shows
// up in `ps`. It is applied to the built-in `neo4j` user through the system database whenever it
// differs from the one last applied, so "password file regenerated" and "fresh home" both just work.
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.connectors.HttpConnector;
import org.neo4j.configuration.connectors.HttpsConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.GraphDatabaseService;
import org.neo4j.io.ByteUnit;

public class Launcher {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: Launcher <home> <port> <password-file> [pagecache-MiB]");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        int port = Integer.parseInt(args[1]);
        Path passwordFile = Path.of(args[2]);
        long pagecacheMiB = args.length > 3 ? Long.parseLong(args[3]) : 128;
        String password = Files.readString(passwordFile, StandardCharsets.UTF_8).strip();
        if (password.length() < 8) {
            System.err.println("password in " + passwordFile + " is shorter than 8 characters");
            System.exit(2);
        }

        long t0 = System.nanoTime();
        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(home)
                .setConfig(BoltConnector.enabled, true)
                .setConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", port))
                .setConfig(HttpConnector.enabled, false)
                .setConfig(HttpsConnector.enabled, false)
                .setConfig(GraphDatabaseSettings.auth_enabled, true)
                .setConfig(GraphDatabaseSettings.pagecache_memory, ByteUnit.mebiBytes(pagecacheMiB))
                .setConfig(GraphDatabaseSettings.preallocate_logical_logs, false)
                .setConfig(GraphDatabaseSettings.udc_enabled, false)
                // Same hardening as production: LOAD CSV must not read server-local files, even
                // from the read-only power-user Cypher (read transactions allow LOAD CSV).
                .setConfig(GraphDatabaseSettings.allow_file_urls, false)
                .build();

        CountDownLatch stopped = new CountDownLatch(1);
        // SIGTERM/SIGINT run shutdown hooks: close the stores cleanly so the next start needs no recovery.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            System.out.println("neo4j-launcher: shutting down");
            System.out.flush();
            try {
                dbms.shutdown();
            } finally {
                stopped.countDown();
                System.out.println("neo4j-launcher: stopped");
                System.out.flush();
            }
        }, "neo4j-shutdown"));

        // Embedded transactions run with full privileges, so the system database accepts the
        // admin command here without a login; the driver then needs this password. A marker with
        // the password's SHA-256 skips it on restarts (compiling that query costs seconds here).
        Path marker = home.resolve("password.applied");
        String digest = sha256(password);
        if (!Files.exists(marker) || !Files.readString(marker, StandardCharsets.UTF_8).strip().equals(digest)) {
            GraphDatabaseService system = dbms.database(GraphDatabaseSettings.SYSTEM_DATABASE_NAME);
            try {
                system.executeTransactionally(
                        "ALTER USER neo4j SET PASSWORD $pw CHANGE NOT REQUIRED", Map.of("pw", password));
            } catch (RuntimeException e) {
                // Setting the password it already has is refused; that is fine too.
                if (!String.valueOf(e.getMessage()).contains("same")) {
                    throw e;
                }
            }
            Files.writeString(marker, digest + "\n", StandardCharsets.UTF_8);
        }
        // Touch the default database so the readiness line means "queries will work".
        dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME).executeTransactionally("RETURN 1");

        long ms = (System.nanoTime() - t0) / 1_000_000;
        System.out.println("neo4j-launcher: READY bolt://127.0.0.1:" + port + " in " + ms + " ms (neo4j "
                + org.neo4j.kernel.internal.Version.getNeo4jVersion() + ")");
        System.out.flush();
        stopped.await();
    }

    private static String sha256(String text) throws java.security.NoSuchAlgorithmException {
        byte[] hash = java.security.MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8));
        StringBuilder hex = new StringBuilder();
        for (byte b : hash) {
            hex.append(String.format("%02x", b));
        }
        return hex.toString();
    }
}
