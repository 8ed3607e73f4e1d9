// Runs many invocations of Kafka's command-line tools in one JVM (tools/apache_kafka.py
// run_tools): a tool's JVM start costs 1-3 s on a small machine, its work a few milliseconds.
//
// Each stdin line is one invocation, tab-separated: base64 of the tool's stdin, the main class,
// then its arguments (each base64).  For each, the tool's main() runs with System.in/out/err
// swapped for buffers and Kafka's Exit procedures replaced by an exception (as Kafka's own tool
// tests do), and one stdout line answers: exit code, base64 stdout, base64 stderr.  The first
// Exit ends the invocation: its code is the answer, and whatever the tool prints after it (its
// own catch blocks seeing the exception) goes nowhere, as it would after a real exit.  Shutdown
// hooks a tool registers run when its invocation ends, as they would when its JVM exits (the
// console producer flushes and closes its producer in one).
//
// Only for Kafka's tools, which end through org.apache.kafka.common.utils.Exit.

import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Base64;

import org.apache.kafka.common.utils.Exit;

public class ToolRunner {
    static final class ToolExit extends RuntimeException {
        final int code;

        ToolExit(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    static Integer exitCode;
    static final List<Runnable> HOOKS = new ArrayList<>();
    static final PrintStream NOWHERE = new PrintStream(OutputStream.nullOutputStream());

    static void exit(int code) {
        if (exitCode == null) {
            exitCode = code;
        }
        System.setOut(NOWHERE);
        System.setErr(NOWHERE);
        throw new ToolExit(code);
    }

    public static void main(String[] args) throws Exception {
        Exit.setExitProcedure((code, message) -> exit(code));
        Exit.setHaltProcedure((code, message) -> exit(code));
        Exit.setShutdownHookAdder((name, runnable) -> HOOKS.add(runnable));
        PrintStream realOut = System.out;
        PrintStream realErr = System.err;
        InputStream realIn = System.in;
        Base64.Decoder b64d = Base64.getDecoder();
        Base64.Encoder b64e = Base64.getEncoder();
        BufferedReader requests = new BufferedReader(new InputStreamReader(realIn, StandardCharsets.UTF_8));
        String line;
        while ((line = requests.readLine()) != null) {
            if (line.isEmpty()) continue;
            String[] f = line.split("\t", -1);
            byte[] stdin = b64d.decode(f[0]);
            String mainClass = f[1];
            String[] toolArgs = Arrays.stream(f, 2, f.length)
                .map(a -> new String(b64d.decode(a), StandardCharsets.UTF_8)).toArray(String[]::new);
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteArrayOutputStream err = new ByteArrayOutputStream();
            int code = 0;
            exitCode = null;
            System.setIn(new ByteArrayInputStream(stdin));
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            try {
                Method m = Class.forName(mainClass).getMethod("main", String[].class);
                m.invoke(null, (Object) toolArgs);
            } catch (InvocationTargetException e) {
                Throwable cause = e.getCause();
                if (exitCode == null) {  // an uncaught exception, as the JVM would print it
                    System.err.print("Exception in thread \"main\" ");
                    cause.printStackTrace(System.err);
                    code = 1;
                }
            } finally {
                for (Runnable hook : HOOKS) {
                    try {
                        hook.run();
                    } catch (RuntimeException e) {
                        e.printStackTrace(System.err);
                    }
                }
                HOOKS.clear();
                if (exitCode != null) {
                    code = exitCode;
                }
                System.out.flush();
                System.err.flush();
                System.setIn(realIn);
                System.setOut(realOut);
                System.setErr(realErr);
            }
            realOut.println(code + "\t" + b64e.encodeToString(out.toByteArray()) + "\t"
                + b64e.encodeToString(err.toByteArray()));
            realOut.flush();
        }
    }
}
