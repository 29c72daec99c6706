with

orders as (

    select * from {{ ref('stg_shop__orders') }}

),

cancellations as (

    select * from {{ ref('stg_shop__cancellations') }}

),

payments as (

    select * from {{ ref('stg_shop__payments') }}

),

-- Cancelled once or twice is cancelled (CONTRACT §3, revenue_hourly v2); the
-- cancellation applies to every order carrying its order_id.
cancelled_orders as (

    select
        order_id,
        min(cancelled_at) as cancelled_at

    from cancellations
    group by order_id

),

paid_orders as (

    select
        order_id,
        sum(amount) as amount_paid,
        min(captured_at) as paid_at

    from payments
    group by order_id

),

final as (

    select
        orders.order_key,
        orders.order_id,
        orders.customer_id,
        orders.currency,
        orders.item_count,
        orders.order_total,
        orders.placed_at,
        cancelled_orders.order_id is not null as is_cancelled,
        cancelled_orders.cancelled_at,
        paid_orders.order_id is not null as is_paid,
        coalesce(paid_orders.amount_paid, 0) as amount_paid,
        paid_orders.paid_at

    from orders
    left join cancelled_orders on orders.order_id = cancelled_orders.order_id
    left join paid_orders on orders.order_id = paid_orders.order_id

)

select * from final
